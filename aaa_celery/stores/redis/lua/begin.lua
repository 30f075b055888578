-- begin.lua: claim a call for a new attempt, or say why not (lifecycle.plan_begin).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id
-- ARGV[2] the delivered CallSpec JSON    ARGV[3] its name    ARGV[4] its idempotency key
-- ARGV[5] its lifecycle.spec_rank (the spec is kept as lifecycle.merge_spec says)
-- ARGV[6] worker      ARGV[7] the claim's lease token (a retried begin sends the same one:
--   if it made the last claim, that attempt is claimed again)      ARGV[8] lease TTL (ms)
-- ARGV[9] retention of a finished call's keys (s)
-- ARGV[10], ARGV[11] name and idempotency key of the spec the events below were built for
-- ARGV[12] from this many attempts on, the call is refused: lifecycle.decide_begin's verdict
--   for the state below, made in Python (n to refuse, n + 1 to claim)
-- ARGV[13] n, the attempt count the payloads below are for (Python sends 0 first),
-- ARGV[14] the attempt that last handed the call on (0: none), ARGV[15] how many did, then
--   if n < cap: ARGV[16], ARGV[17] id and JSON of attempt n+1's aaa.tool.started event
--     (lifecycle.started_event);
--   else: ARGV[16] the refusal Outcome JSON (lifecycle.refusal), ARGV[17], ARGV[18] id
--     and JSON of its result event (lifecycle.result_event).
-- Touches: spec (created or upgraded; its token on a claim), and on a claim attempts, lease, events, running,
-- unclaimed, recovery (deleted); on a refusal result, lease, events, running, unclaimed and the TTLs.
-- Returns {"finished", outcome JSON} | {"busy", worker, expires ms} | {"refused"} |
--         {"claimed", attempt, expires ms}, or, having written nothing but the spec:
--         {"respec", spec JSON}: the spec in force is not the one the events were built for;
--         {"recount", attempts, handed on, handed, lost cause}: the call is in another state than the
--         one the payloads were built for (a call run before), so they must be built again.

local now, at = clock()
ensure_spec(ARGV[2], ARGV[3], ARGV[4], ARGV[5])

local result = redis.call('GET', RESULT)
if result then
  return {'finished', result}
end
local expires = now + tonumber(ARGV[8])
local function lease(attempt)
  redis.call('HSET', LEASE, 'token', ARGV[7], 'worker', ARGV[6], 'attempt', attempt)
  lease_until(expires)
  redis.call('HSET', SPEC, 'token', ARGV[7])
  redis.call('ZREM', UNCLAIMED, CALL)
  redis.call('ZADD', RUNNING, expires, CALL)
  redis.call('DEL', RECOVERY)  -- claimed: a later crash may be recovered at once
end
if redis.call('HGET', SPEC, 'token') == ARGV[7] then
  -- This token made the last claim (a retried begin whose reply was lost): the same
  -- attempt again, live or lapsed; its started event was written with that claim.
  local attempt = tonumber(redis.call('GET', ATTEMPTS))
  lease(attempt)
  return {'claimed', attempt, expires}
end
if redis.call('EXISTS', LEASE) == 1 then
  return {'busy', redis.call('HGET', LEASE, 'worker'), now + redis.call('PTTL', LEASE) + 1}
end
local spec = respec(ARGV[10], ARGV[11])
if spec then
  return {'respec', spec}
end

local attempts = tonumber(redis.call('GET', ATTEMPTS) or '0')
local handed = redis.call('HMGET', SPEC, 'handed_on', 'handed')
local handed_on, handed_n = tonumber(handed[1] or '0'), tonumber(handed[2] or '0')
if attempts ~= tonumber(ARGV[13]) or handed_on ~= tonumber(ARGV[14]) or handed_n ~= tonumber(ARGV[15]) then
  -- the cause the last attempt's holder recorded with its fenced event (lifecycle.CallState.lost_cause)
  local cause, fenced = '', CALL .. ':attempt:' .. attempts .. ':fenced'
  for _, e in ipairs(redis.call('LRANGE', EVENTS, 0, -1)) do
    local entry = cjson.decode(e)
    if entry.id == fenced then
      local data = cjson.decode(entry.event).data
      if type(data) == 'table' and type(data.cause) == 'string' then cause = data.cause end
    end
  end
  return {'recount', attempts, handed_on, handed_n, cause}
end
if attempts >= tonumber(ARGV[12]) then
  record(ARGV[16], ARGV[17], ARGV[18], at, ARGV[9])
  return {'refused'}
end

local attempt = attempts + 1
redis.call('SET', ATTEMPTS, attempt)
lease(attempt)
push_event(ARGV[16], ARGV[17], at)
return {'claimed', attempt, expires}
