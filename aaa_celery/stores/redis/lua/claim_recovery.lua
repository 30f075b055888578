-- claim_recovery.lua: take the right to republish a call (lifecycle.plan_recovery_claim,
-- planned in Python for the state it expects), if the call is in that state (a
-- compare-and-set); else reply the state it is in.
--
-- KEYS and ARGV[1]: the call keys and the call id (_lib.lua).
-- ARGV[2] the expected state, "<known>:<result>:<live>:<tries>:<until (ms)>": known 1 if the
--   call's spec exists, result 1 if it has one, live 1 if a lease holds it, and its recovery
--   record (tries and until: "0:0" for none)
-- ARGV[3] worker      ARGV[4] the claim's republish count (tries)      ARGV[5] its hold (ms)
-- ARGV[6] the record's TTL (s)
-- Checks, and nothing else: that the call is in the expected state (the lease in the same
-- step as the claim, so a call that a worker just claimed is never republished).
-- Touches: recovery (a hash: worker, until (ms), tries), its TTL. begin.lua deletes it on a claim.
-- Returns ARGV[4] when the claim is made; {known, result, live, tries, until (ms), now (ms)},
--   having written nothing: the state now.

local rec = redis.pcall('HMGET', RECOVERY, 'tries', 'until')
if rec.err then
  redis.call('DEL', RECOVERY)  -- a plain hold string of a version older than 0.1.0
  rec = {}
end
local now = clock()
local known = tostring(redis.call('EXISTS', SPEC))
local result = tostring(redis.call('EXISTS', RESULT))
local live = tostring(redis.call('EXISTS', LEASE))
local tries, held = rec[1] or '0', rec[2] or '0'
if ARGV[2] ~= known .. ':' .. result .. ':' .. live .. ':' .. tries .. ':' .. held then
  return {known, result, live, tries, held, now}
end
redis.call('HSET', RECOVERY, 'worker', ARGV[3], 'until', now + tonumber(ARGV[5]), 'tries', ARGV[4])
redis.call('EXPIRE', RECOVERY, ARGV[6])
return tonumber(ARGV[4])
