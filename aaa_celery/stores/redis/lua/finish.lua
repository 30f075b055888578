-- finish.lua: record an attempt's outcome, first writer wins (lifecycle.plan_finish).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] lease token     ARGV[3] the lease's attempt (its fence)
-- ARGV[4] Outcome JSON, stamped with that attempt       ARGV[5] "1" to fence results
-- ARGV[6] retention of a finished call's keys (s)      ARGV[7] CallSpec JSON of a bare call
-- ARGV[8] name of the spec the events below were built for
-- ARGV[9], ARGV[10] id and JSON of the result event (lifecycle.result_event)
-- ARGV[11], ARGV[12] id and JSON of the aaa.tool.stale_result event (lifecycle.stale_event),
--   sent only when a first try answered {"stale_event"}
-- Touches: spec (created if unknown); on accept result, lease, events, running, unclaimed and
-- the TTLs; on stale events, and lease and running if this lease still holds the call.
-- Returns {"accepted"} (also when this very outcome is already recorded) |
--         {"stale"} | {"stale", current outcome JSON}, or, having written nothing but the
--         spec, {"respec", spec JSON}: the spec in force is not the one the events were
--         built for; {"stale_event"}: the outcome is stale and its event was not sent.

local _, at = clock()
ensure_spec(ARGV[7], '', '', '0')

-- lifecycle.decide_finish: again (this very outcome is recorded), accept, or stale.
local result = redis.call('GET', RESULT)
local accept = false
if result then
  if result == ARGV[4] then
    return {'accepted'}
  end
else
  local attempts = tonumber(redis.call('GET', ATTEMPTS) or '0')
  accept = not (ARGV[5] == '1' and attempts > tonumber(ARGV[3]))
end

local spec = respec(ARGV[8], nil)
if spec then
  return {'respec', spec}
end
if accept then
  record(ARGV[4], ARGV[9], ARGV[10], at, ARGV[6])
  return {'accepted'}
end
if not ARGV[12] then
  return {'stale_event'}
end
push_event(ARGV[11], ARGV[12], at)
forget(ARGV[2])
if holds(ARGV[2]) then
  drop_lease()
end
return {'stale', result}
