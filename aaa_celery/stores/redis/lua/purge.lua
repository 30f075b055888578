-- purge.lua: retention on demand: apply lifecycle.plan_purge's plan for one call, if the call
-- is in the state it was planned for (a compare-and-set); else reply the state it is in.
--
-- KEYS and ARGV[1]: the call keys and the call id (_lib.lua).
-- ARGV[2] the expected state, "<known>:<result>" (known: 1 if the call's spec exists; result:
--   1 if it has one)   ARGV[3] when the calls index says it was seen (ms, server clock)
-- ARGV[4] what to delete: 'call' (every key of the call, each kind of record lifecycle.PURGED
--   names, and its entries in the shard's running, unclaimed and calls indexes) or 'entry'
--   (its calls index entry: its keys expired with their retention)
-- Checks, and nothing else: that the call is in the expected state.
-- Touches: what ARGV[4] names.
-- Returns 1: deleted; or, having written nothing, {known, result, seen (ms) or false}.

local seen = redis.call('ZSCORE', CALLS, CALL)
local state = redis.call('EXISTS', SPEC) .. ':' .. redis.call('EXISTS', RESULT)
if ARGV[2] ~= state or not seen or tonumber(seen) ~= tonumber(ARGV[3]) then
  return {redis.call('EXISTS', SPEC), redis.call('EXISTS', RESULT), seen}
end
if ARGV[4] == 'call' then
  redis.call('DEL', SPEC, ATTEMPTS, RESULT, LEASE, EVENTS, RECOVERY)
  redis.call('ZREM', RUNNING, CALL)
  redis.call('ZREM', UNCLAIMED, CALL)
end
redis.call('ZREM', CALLS, CALL)
return 1
