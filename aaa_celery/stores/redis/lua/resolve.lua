-- resolve.lua: an operator's verdict (lifecycle.plan_resolve) or a reconcile step's settlement
-- (lifecycle.plan_settle) replaces a result in doubt, if the result is still the one the plan
-- was made for (a compare-and-set).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] the result JSON the plan was made for
-- ARGV[3] "1": an operator's resolution (the spec's field resolved is set), "0": not
-- ARGV[4...] the plan's writes (_lib.lua's apply): 'settle' and 'event'.
-- Checks, and nothing else: that the result is ARGV[2].
-- Touches: result (its TTL kept), spec (field resolved), events.
-- Returns {1}: the writes are applied; {0, result JSON or false}: the result is another
-- one, and nothing was written.

local result = redis.call('GET', RESULT)
if result ~= ARGV[2] then
  return {0, result}
end
local now, at = clock()
apply(4, now, at, {})
if ARGV[3] == '1' then
  redis.call('HSET', SPEC, 'resolved', '1')
end
return {1}
