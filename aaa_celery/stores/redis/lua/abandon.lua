-- abandon.lua: end a call that recovery could not bring back with a failure result.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] the attempt count the outcome was built for
-- ARGV[3] the failure Outcome JSON     ARGV[4], ARGV[5] id and JSON of its result event
-- ARGV[6] retention of a finished call's keys (s)
-- Touches: result, lease, events, running, unclaimed, recovery and the TTLs (record).
-- Returns 1 when the failure was recorded; 0 (writing nothing) when the call is unknown,
-- has a result, is held by a live lease, or has another attempt count.

if redis.call('EXISTS', SPEC) == 0 or redis.call('EXISTS', RESULT) == 1
    or redis.call('EXISTS', LEASE) == 1 then
  return 0
end
if tonumber(redis.call('GET', ATTEMPTS) or '0') ~= tonumber(ARGV[2]) then
  return 0
end
local _, at = clock()
record(ARGV[3], ARGV[4], ARGV[5], at, ARGV[6])
redis.call('DEL', RECOVERY)
return 1
