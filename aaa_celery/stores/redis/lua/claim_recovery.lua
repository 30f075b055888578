-- claim_recovery.lua: take the right to republish a call (lifecycle.plan_recovery_claim,
-- planned in Python for the recovery record it expects), if the record is the expected one
-- (a compare-and-set); else reply the record it is.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] the expected record, "<tries>:<until (ms)>" ("0:0": none)
-- ARGV[3] worker      ARGV[4] the claim's republish count (tries)      ARGV[5] its hold (ms)
-- ARGV[6] the record's TTL (s)
-- Checks, and nothing else: that the call is known, has no result and no live lease (checked
-- here, in the same step as the claim, so a call that a worker just claimed is never
-- republished), and that its record is the expected one (the plan was made, in Python, for a
-- hold that had ended: a record that is unchanged still has; none holds nothing).
-- Touches: recovery (a hash: worker, until (ms), tries), its TTL. begin.lua deletes it on a claim.
-- Returns ARGV[4] when the claim is made; 0 for an unknown, finished or leased call;
--   {tries, until (ms), now (ms)}, having written nothing: the record is another one.

if redis.call('EXISTS', SPEC) == 0 or redis.call('EXISTS', RESULT, LEASE) > 0 then
  return 0
end
local rec = redis.pcall('HMGET', RECOVERY, 'tries', 'until')
if rec.err then
  redis.call('DEL', RECOVERY)  -- a plain hold string of a version older than 0.1.0
  rec = {}
end
local now = clock()
local tries, held = rec[1] or '0', rec[2] or '0'
if ARGV[2] ~= tries .. ':' .. held then
  return {tries, held, now}
end
redis.call('HSET', RECOVERY, 'worker', ARGV[3], 'until', now + tonumber(ARGV[5]), 'tries', ARGV[4])
redis.call('EXPIRE', RECOVERY, ARGV[6])
return tonumber(ARGV[4])
