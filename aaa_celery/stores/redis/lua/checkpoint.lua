-- checkpoint.lua: keep a tool's checkpoint as the call's last one, if this lease holds the call
-- (lifecycle.plan_checkpoint decides; this script checks the lease in the step that writes).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token     ARGV[3] the checkpoint JSON (lifecycle.checked_checkpoint)
-- Touches: spec (its checkpoint field, which expires with the call's record), only if this
-- token holds the call.
-- Returns 1 if kept, 0 if the lease lapsed or another attempt holds the call.

if not holds(ARGV[2]) then
  return 0
end
redis.call('HSET', SPEC, 'checkpoint', ARGV[3])
return 1
