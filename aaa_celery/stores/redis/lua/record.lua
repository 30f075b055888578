-- record.lua: apply lifecycle.plan_record's writes for an outcome recorded from outside an
-- attempt, if the call is in the state they were planned for (a compare-and-set); else reply
-- the state it is in.
--
-- KEYS and ARGV[1]: the call keys and the call id (_lib.lua).
-- ARGV[2] CallSpec JSON   ARGV[3] name   ARGV[4] idempotency key   ARGV[5] spec_rank and
--   ARGV[6] replaces_below of the call to register first, as register.lua would; '' '' '' ''
--   '': a call recovery knows, never registered here
-- The expected state (as RedisStore.record sends it):
--   ARGV[7] "<known>:<result>:<attempts>:<live>" (known: 1 if the call's spec exists; result:
--   1 if it has a result; live: 1 if a lease holds it)   ARGV[8] name of the spec in force
-- ARGV[9...] the plan's writes (_lib.lua's apply): 'record' and 'event', or none.
-- Checks, and nothing else: that the call's keys hold the state above.
-- Touches: spec (created or merged, unless ARGV[2] is ''); with the writes, what they touch,
-- and recovery (deleted: the call has its result).
-- Returns {1}: the writes are applied; or, having written nothing but the spec, {0, known,
--   result JSON or false, attempts, live, spec JSON or false}: the state now.

if ARGV[2] ~= '' then
  ensure_spec(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
end
local spec = redis.call('HMGET', SPEC, 'name', 'json')
local state = redis.call('MGET', RESULT, ATTEMPTS)
local known = spec[1] and '1' or '0'
local attempts = state[2] or '0'
local live = redis.call('EXISTS', LEASE) == 1 and '1' or '0'
if ARGV[7] == known .. ':' .. (state[1] and '1' or '0') .. ':' .. attempts .. ':' .. live and ARGV[8] == (spec[1] or '') then
  local now, at = clock()
  apply(9, now, at, {})
  if ARGV[9] then
    redis.call('DEL', RECOVERY)
  end
  return {1}
end
return {0, known, state[1], attempts, live, spec[2]}
