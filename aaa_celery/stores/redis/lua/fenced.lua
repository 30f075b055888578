-- fenced.lua: audit an attempt that lost its lease and was cancelled (lifecycle.plan_fenced).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token
-- ARGV[3], ARGV[4] id and JSON of the aaa.tool.fenced event (lifecycle.fenced_event)
-- Touches: events; lease and running if this token still holds the call.
-- Returns 0 for an unknown call, else 1.

if redis.call('EXISTS', SPEC) == 0 then
  return 0
end
local _, at = clock()
push_event(ARGV[3], ARGV[4], at)
forget(ARGV[2])
if holds(ARGV[2]) then
  drop_lease()
end
return 1
