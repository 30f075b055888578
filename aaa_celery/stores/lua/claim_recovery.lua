-- claim_recovery.lua: take the right to republish a known call, once per hold.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] worker     ARGV[3] hold (ms)
-- Touches: recovery (SET NX PX).
-- Returns 1 to exactly one caller per hold, else 0 (also for an unknown call).

if redis.call('EXISTS', SPEC) == 0 then
  return 0
end
if redis.call('SET', RECOVERY, ARGV[2], 'NX', 'PX', ARGV[3]) then
  return 1
end
return 0
