-- claim_recovery.lua: take the right to republish a call, with backoff.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] worker     ARGV[3] hold of the first republish (ms)
-- ARGV[4] longest hold (ms)     ARGV[5] retention of the record (s)
-- Touches: recovery (a hash: worker, until (ms), tries), its TTL.
-- Returns n >= 1, the call's n-th republish since its last claim, to exactly one caller
-- per hold; the hold of the n-th is ARGV[3] * 2^(n-1), at most ARGV[4]. Returns 0 when
-- the call is unknown, has its result, is held by a live lease (checked here, in the same
-- step as the claim, so a call that a worker just claimed is never republished), or is
-- still held by an earlier republish. begin.lua deletes the record on a claim.

if redis.call('EXISTS', SPEC) == 0 or redis.call('EXISTS', RESULT) == 1
    or redis.call('EXISTS', LEASE) == 1 then
  return 0
end
if redis.call('TYPE', RECOVERY).ok ~= 'hash' then
  redis.call('DEL', RECOVERY)  -- none yet, or a plain hold string of an older version
end
local now = clock()
local rec = redis.call('HMGET', RECOVERY, 'until', 'tries')
if rec[1] and tonumber(rec[1]) > now then
  return 0
end
local tries = tonumber(rec[2] or '0') + 1
local hold = math.floor(math.min(tonumber(ARGV[4]), tonumber(ARGV[3]) * 2 ^ (tries - 1)))
redis.call('HSET', RECOVERY, 'worker', ARGV[2], 'until', now + hold, 'tries', tries)
redis.call('EXPIRE', RECOVERY, math.max(tonumber(ARGV[5]), math.ceil(hold / 1000) * 2))
return tries
