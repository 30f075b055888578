-- run_lease.lua: take a run's lease, or renew it (stores/runs_redis.py).
--
-- KEYS[1] lease   KEYS[2] record
-- ARGV[1] holder  ARGV[2] TTL (ms)
-- Returns 1 if the holder holds the lease now (it was free, lapsed, or theirs), else 0.

if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then
  return 0
end
-- The lease lapses at now + TTL (lifecycle.lapsed: from its expiry on); Redis keeps a key
-- until its clock has passed the key's expiry, so the key expires 1 ms (its step) before.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', now + tonumber(ARGV[2]) - 1)
return 1
