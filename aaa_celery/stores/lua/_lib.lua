-- _lib.lua: shared helpers, prepended to every script in this folder (not a script itself).
--
-- Every call script gets the same KEYS, all under the hash tag {<p>:<shard>} of the call's
-- shard (shard = crc32(call id) % shards, see redis.py), so a script touches one hash slot
-- only and runs on Redis Cluster. Written <t> = <p>:{<p>:<shard>} below:
--   KEYS[1] <t>:<call>:spec      hash: json (CallSpec), name, ikey, req ("1" if it has a request)
--   KEYS[2] <t>:<call>:attempts  integer: the last attempt number, the fencing token
--   KEYS[3] <t>:<call>:result    string: the one Outcome JSON
--   KEYS[4] <t>:<call>:lease     hash with a PX TTL: token, worker, attempt
--   KEYS[5] <t>:<call>:events    list of Event JSON, oldest first
--   KEYS[6] <t>:running          zset, the shard's: claimed calls without a result,
--                                score = lease expiry (ms)
--   KEYS[7] <t>:unclaimed        zset, the shard's: registered, never claimed calls,
--                                score = registration (ms)
--   KEYS[8] <t>:<call>:recovery  string with a PX TTL: who may republish the call
-- The script reads no other key; TIME is the clock of the node that owns the slot.
-- ARGV[1] is always the call id. Event JSON is built byte for byte like
-- lifecycle.Event.to_json; any value JSON (an outcome) comes encoded from Python.

local SPEC, ATTEMPTS, RESULT, LEASE, EVENTS, RUNNING, UNCLAIMED, RECOVERY = unpack(KEYS)
local CALL = ARGV[1]
local enc = cjson.encode

-- The server clock: milliseconds (leases, index) and seconds as a decimal string (events).
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- Whether the lease with this token holds the call (an expired lease key is gone).
local function holds(token)
  return redis.call('HGET', LEASE, 'token') == token
end

-- Free the lease; the call stays in the running index, lapsed for any `now`.
local function drop_lease()
  redis.call('DEL', LEASE)
  redis.call('ZADD', RUNNING, 'XX', 0, CALL)
end

-- Store the call's spec unless known; a spec with a request replaces one without
-- (MemoryStore._call). Returns true when the call is new.
local function ensure_spec(json, name, ikey, req)
  if redis.call('EXISTS', SPEC) == 0 then
    redis.call('HSET', SPEC, 'json', json, 'name', name, 'ikey', ikey, 'req', req)
    return true
  end
  if req == '1' and redis.call('HGET', SPEC, 'req') ~= '1' then
    redis.call('HSET', SPEC, 'json', json, 'name', name, 'ikey', ikey, 'req', req)
  end
  return false
end

-- Append an event unless one with the same id exists (ids are stable, see lifecycle.event_id).
local function push_event(id, kind, attempt, data, at)
  local head = '{"id":' .. enc(id) .. ','
  for _, e in ipairs(redis.call('LRANGE', EVENTS, 0, -1)) do
    if string.sub(e, 1, #head) == head then return end
  end
  redis.call('RPUSH', EVENTS, head .. '"type":' .. enc(kind) .. ',"call_id":' .. enc(CALL)
    .. ',"attempt":' .. attempt .. ',"data":' .. data .. ',"at":' .. at .. '}')
end

-- lifecycle.result_data; `tail` is '"value":...' or '"error":...,"message":...'.
local function result_data(attempt, tail)
  local name = redis.call('HGET', SPEC, 'name') or ''
  return '{"call_id":' .. enc(CALL) .. ',"name":' .. enc(name) .. ',"attempt":' .. attempt
    .. ',' .. tail .. '}'
end

-- Record the call's one result, free its lease, drop it from the indexes and keep
-- its keys for `retention` seconds.
local function record(outcome, kind, attempt, tail, at, retention)
  redis.call('SET', RESULT, outcome)
  redis.call('DEL', LEASE)
  push_event(CALL .. ':result', kind, attempt, result_data(attempt, tail), at)
  redis.call('ZREM', RUNNING, CALL)
  redis.call('ZREM', UNCLAIMED, CALL)
  for _, key in ipairs({SPEC, ATTEMPTS, RESULT, EVENTS}) do
    redis.call('EXPIRE', key, retention)
  end
end

