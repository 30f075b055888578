-- purge.lua: retention on demand: delete one call seen before a cutoff, if finished
-- (lifecycle.purgeable: its calls index score is when it was last seen anew).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] the cutoff (ms, server clock)
-- Touches: every key of the call (each kind of record lifecycle.PURGED names), and its entries in the shard's running, unclaimed and
-- calls indexes.
-- Returns 1: a finished call was deleted; 2: only its index entry was left (its keys
-- expired with their retention) and is dropped; 0: kept (seen later, or no result yet).

local seen = redis.call('ZSCORE', CALLS, CALL)
if not seen or tonumber(seen) >= tonumber(ARGV[2]) then
  return 0
end
local known = redis.call('EXISTS', SPEC) == 1
if known and redis.call('EXISTS', RESULT) == 0 then
  return 0
end
redis.call('DEL', SPEC, ATTEMPTS, RESULT, LEASE, EVENTS, RECOVERY)
redis.call('ZREM', RUNNING, CALL)
redis.call('ZREM', UNCLAIMED, CALL)
redis.call('ZREM', CALLS, CALL)
if known then
  return 1
end
return 2
