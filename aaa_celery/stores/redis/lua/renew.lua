-- renew.lua: extend a live lease by its TTL, if this token still holds the call.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token     ARGV[3] lease TTL (ms)
-- Touches: lease (its expiry, _lib.lua's lease_until), running (the new expiry).
-- Returns 1 if renewed, 0 if the lease lapsed or another attempt holds the call.

if not holds(ARGV[2]) then
  return 0
end
local now = clock()
lease_until(now + tonumber(ARGV[3]))
redis.call('ZADD', RUNNING, 'XX', now + tonumber(ARGV[3]), CALL)
return 1
