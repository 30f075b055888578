-- finish.lua: record an attempt's outcome, first writer wins (lifecycle.decide_finish).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token     ARGV[3] the lease's attempt (its fence)
-- ARGV[4] Outcome JSON, stamped with that attempt
-- ARGV[5] its '"value":...' or '"error":...,"message":...' JSON, for the event data
-- ARGV[6] event type (completed or failed)    ARGV[7] "1" to fence results
-- ARGV[8] retention of a finished call's keys (s)    ARGV[9] CallSpec JSON of a bare call
-- Touches: spec (created if unknown); on accept result, lease, events, running, unclaimed and
-- the TTLs; on stale events, and lease and running if this lease still holds the call.
-- Returns {"accepted"} (also when this very outcome is already recorded) |
--         {"stale"} | {"stale", current outcome JSON}.

local _, at = clock()
ensure_spec(ARGV[9], '', '', '0')

local result = redis.call('GET', RESULT)
local attempts = tonumber(redis.call('GET', ATTEMPTS) or '0')
if result then
  if result == ARGV[4] then
    return {'accepted'}
  end
elseif not (ARGV[7] == '1' and attempts > tonumber(ARGV[3])) then
  record(ARGV[4], ARGV[6], ARGV[3], ARGV[5], at, ARGV[8])
  return {'accepted'}
end

push_event(CALL .. ':attempt:' .. ARGV[3] .. ':stale', STALE_RESULT, ARGV[3],
  result_data(ARGV[3], ARGV[5]), at)
if holds(ARGV[2]) then
  drop_lease()
end
return {'stale', result}
