-- resolve.lua: an operator's verdict (lifecycle.plan_resolve) or a reconcile step's settlement
-- replaces a result in doubt, if the result is still the one it was planned for (a
-- compare-and-set; planned in Python on the result read before).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] the result JSON the verdict was decided on
-- ARGV[3] the new Outcome JSON     ARGV[4], ARGV[5] id and JSON of the audit event
--   (aaa.tool.resolved, aaa.tool.reconciled)
-- ARGV[6] "1": an operator's resolution (the spec's field resolved is set), "0": not
-- Checks, and nothing else: that the result is ARGV[2].
-- Touches: result (its TTL kept), spec (field resolved), events.
-- Returns {"resolved"} | {"changed", current result JSON or nil}: the result is no longer
-- the one the verdict was decided on, and nothing was written.

local _, at = clock()
local result = redis.call('GET', RESULT)
if result ~= ARGV[2] then
  return {'changed', result}
end
redis.call('SET', RESULT, ARGV[3], 'KEEPTTL')
if ARGV[6] == '1' then
  redis.call('HSET', SPEC, 'resolved', '1')
end
push_event(ARGV[4], ARGV[5], at)
return {'resolved'}
