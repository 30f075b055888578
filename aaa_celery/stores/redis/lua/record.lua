-- record.lua: record an outcome from outside an attempt (lifecycle.plan_record), with no lease.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] kind: "first", "fenced" or "abandon" (lifecycle.RecordKind)
-- ARGV[3] the outcome's attempt (fenced: the latest attempt it may end; abandon: the
--   attempt count it was built for)     ARGV[4] the Outcome JSON
-- ARGV[5] CallSpec JSON   ARGV[6] name   ARGV[7] idempotency key   ARGV[8] spec_rank
--   of the call to register first (first, fenced; as register.lua)
-- ARGV[9] name of the spec the event below was built for
-- ARGV[10], ARGV[11] id and JSON of the result event (lifecycle.result_event)
-- ARGV[12] retention of a finished call's keys (s)
-- Touches: spec (first, fenced: created or merged); on record result, lease, events,
-- running, unclaimed, recovery and the TTLs (record).
-- Returns {"recorded"}; {"refused"}, having written nothing but the spec, when
-- lifecycle.record_allowed says no (a result exists; fenced: a later attempt started;
-- abandon: an unknown call, a live lease, or another attempt count); or {"respec", spec
-- JSON} having written nothing but the spec: the event was built for another spec.

local kind = ARGV[2]
if kind == 'abandon' then
  if redis.call('EXISTS', SPEC) == 0 or redis.call('EXISTS', LEASE) == 1 then
    return {'refused'}
  end
else
  ensure_spec(ARGV[5], ARGV[6], ARGV[7], ARGV[8])
end
if redis.call('EXISTS', RESULT) == 1 then
  return {'refused'}
end
local attempts = tonumber(redis.call('GET', ATTEMPTS) or '0')
local attempt = tonumber(ARGV[3])
if (kind == 'fenced' and attempts > attempt) or (kind == 'abandon' and attempts ~= attempt) then
  return {'refused'}
end
local spec = respec(ARGV[9], nil)
if spec then
  return {'respec', spec}
end
local _, at = clock()
record(ARGV[4], ARGV[10], ARGV[11], at, ARGV[12])
redis.call('DEL', RECOVERY)
return {'recorded'}
