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
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
