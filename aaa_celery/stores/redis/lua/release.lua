-- release.lua: give the lease back without a result, the attempt counting as lost
-- (lifecycle.plan_release).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token
-- Touches: lease (deleted) and running (lapsed), only if this token holds the call.
-- Returns 1 if the lease was freed, else 0.

forget(ARGV[2])
if not holds(ARGV[2]) then
  return 0
end
drop_lease()
return 1
