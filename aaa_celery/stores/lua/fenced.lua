-- fenced.lua: audit an attempt that lost its lease and was cancelled (aaa.tool.fenced).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token     ARGV[3] the lease's attempt
-- ARGV[4] the event's data JSON (lifecycle.fenced_data)
-- Touches: events; lease and running if this token still holds the call.
-- Returns 0 for an unknown call, else 1.

if redis.call('EXISTS', SPEC) == 0 then
  return 0
end
local _, at = clock()
push_event(CALL .. ':attempt:' .. ARGV[3] .. ':fenced', FENCED, ARGV[3], ARGV[4], at)
if holds(ARGV[2]) then
  drop_lease()
end
return 1
