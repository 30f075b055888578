-- register.lua: remember a call at publish time, so recovery finds it if the broker loses it.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] CallSpec JSON     ARGV[3] name     ARGV[4] idempotency key
-- ARGV[5] the spec's lifecycle.spec_rank   ARGV[6] lifecycle.replaces_below of the spec
-- Touches: spec (created, or given the request it lacked); unclaimed for a new call.
-- Returns 1 for a new call, 0 for a known one.

local now = clock()  -- one reading for both indexes
if not ensure_spec(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], now) then
  return 0
end
redis.call('ZADD', UNCLAIMED, 'NX', now, CALL)
return 1
