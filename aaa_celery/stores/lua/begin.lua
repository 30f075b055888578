-- begin.lua: claim a call for a new attempt, or say why not (lifecycle.decide_begin).
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id           ARGV[2] CallSpec JSON    ARGV[3] name    ARGV[4] idempotency key
-- ARGV[5] "1" if the spec has a request              ARGV[6] worker  ARGV[7] new lease token
-- ARGV[8] lease TTL (ms)
-- ARGV[9] attempt cap: 1 under at_most_once (any started attempt ends the call), else max_attempts
-- ARGV[10] the refusal's '"error":...,"message":...' JSON, "{attempts}" standing for the count
-- ARGV[11] retention of a finished call's keys (s)
-- Touches: spec (created or upgraded), and on a claim attempts, lease, events, running,
-- unclaimed, recovery (deleted); on a refusal result, lease, events, running, unclaimed and the TTLs.
-- Returns {"finished", outcome JSON} | {"busy", worker, expires ms} |
--         {"refused", outcome JSON} | {"claimed", attempt, expires ms}.

local now, at = clock()
ensure_spec(ARGV[2], ARGV[3], ARGV[4], ARGV[5])

local result = redis.call('GET', RESULT)
if result then
  return {'finished', result}
end
if redis.call('EXISTS', LEASE) == 1 then
  return {'busy', redis.call('HGET', LEASE, 'worker'), now + redis.call('PTTL', LEASE)}
end

local attempts = tonumber(redis.call('GET', ATTEMPTS) or '0')
if attempts > 0 and attempts >= tonumber(ARGV[9]) then
  local tail = string.gsub(ARGV[10], '{attempts}', attempts)
  local outcome = '{"ok":false,"value":null,' .. tail .. ',"attempt":' .. attempts .. '}'
  record(outcome, FAILED, attempts, tail, at, ARGV[11])
  return {'refused', outcome}
end

local attempt = attempts + 1
local expires = now + tonumber(ARGV[8])
redis.call('SET', ATTEMPTS, attempt)
redis.call('HSET', LEASE, 'token', ARGV[7], 'worker', ARGV[6], 'attempt', attempt)
redis.call('PEXPIRE', LEASE, ARGV[8])
redis.call('ZREM', UNCLAIMED, CALL)
redis.call('ZADD', RUNNING, expires, CALL)
redis.call('DEL', RECOVERY)  -- claimed: a later crash may be recovered at once
local spec = redis.call('HMGET', SPEC, 'name', 'ikey')
push_event(CALL .. ':attempt:' .. attempt, STARTED, attempt,
  '{"call_id":' .. enc(CALL) .. ',"name":' .. enc(spec[1]) .. ',"attempt":' .. attempt
  .. ',"worker":' .. enc(ARGV[6]) .. ',"idempotency_key":' .. enc(spec[2]) .. '}', at)
return {'claimed', attempt, expires}
