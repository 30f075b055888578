-- hand_on.lua: an attempt ends without a result and hands the call on to its next delivery
-- (lifecycle.plan_hand_on: a retry its body asked for).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token     ARGV[3] the lease's attempt
-- ARGV[4], ARGV[5] id and JSON of the aaa.tool.retried event (lifecycle.retried_event)
-- Touches: events; spec (handed_on, handed), lease, running and unclaimed if this token still holds the
-- call: it leaves the running index for the unclaimed one, scored now, so recovery brings it
-- back only once the unclaimed grace has passed (as a newly registered call), and the calls
-- index scores it now too (seen now, as lifecycle.purgeable says).
-- Returns 0 for an unknown call, else 1.

if redis.call('EXISTS', SPEC) == 0 then
  return 0
end
local now, at = clock()
push_event(ARGV[4], ARGV[5], at)
if holds(ARGV[2]) then
  redis.call('HSET', SPEC, 'handed_on', ARGV[3])
  redis.call('HINCRBY', SPEC, 'handed', 1)
  redis.call('HDEL', SPEC, 'token')
  redis.call('DEL', LEASE)
  redis.call('ZREM', RUNNING, CALL)
  redis.call('ZADD', UNCLAIMED, now, CALL)
  redis.call('ZADD', CALLS, 'XX', now, CALL)  -- seen again now (lifecycle.purgeable)
end
return 1
