-- _lib.lua: shared helpers, prepended to every script in this folder (not a script itself).
--
-- Every call script gets the same KEYS, all under the hash tag {<p>:<shard>} of the call's
-- shard (shard = crc32(call id) % shards, see redis.py), so a script touches one hash slot
-- only and runs on Redis Cluster. Written <t> = <p>:{<p>:<shard>} below:
--   KEYS[1] <t>:<call>:spec      hash: json (CallSpec), name, ikey, req (lifecycle.spec_rank),
--                                handed_on (the attempt that last handed the call on, if any),
--                                handed (how many attempts did), token (of the last claim,
--                                until its holder lets it go: lifecycle.CallState.token),
--                                checkpoint (a tool's last one: lifecycle.Checkpoint JSON)
--   KEYS[2] <t>:<call>:attempts  integer: the last attempt number, the fencing token
--   KEYS[3] <t>:<call>:result    string: the one Outcome JSON
--   KEYS[4] <t>:<call>:lease     hash with a PX TTL: token, worker, attempt
--   KEYS[5] <t>:<call>:events    list, oldest first, of audit entries (see push_event)
--   KEYS[6] <t>:running          zset, the shard's: claimed calls without a result,
--                                score = lease expiry (ms)
--   KEYS[7] <t>:unclaimed        zset, the shard's: registered, never claimed calls,
--                                score = registration (ms)
--   KEYS[8] <t>:<call>:recovery  hash: who may republish the call (worker), until when (ms),
--                                and how often it was republished since its last claim (tries)
--   KEYS[9] <t>:calls            zset, the shard's: every call, score = when first seen (ms),
--                                for operators (`celery aaa calls`, `purge`)
-- The script reads no other key; TIME is the clock of the node that owns the slot.
-- ARGV[1] is always the call id.
--
-- Payloads. Every outcome and audit event comes from Python as JSON already encoded by
-- lifecycle (Outcome.to_json, Draft.to_json: the event without its time). The scripts
-- store that JSON as it is and never build or edit JSON text: the one thing they add
-- is the server's time of an event, kept beside the event's JSON (push_event). Where
-- the payload depends on what the script reads (the attempt number, the spec in force,
-- a stale result), Python sends the payload of the common case only, and in the others
-- the script answers {"recount", ...} / {"respec", ...} / {"stale_event"} without
-- writing, and Python sends it again with the payload that case needs.

local SPEC, ATTEMPTS, RESULT, LEASE, EVENTS, RUNNING, UNCLAIMED, RECOVERY, CALLS = unpack(KEYS)
local CALL = ARGV[1]

-- The server clock: milliseconds (leases, index) and seconds as a decimal string (events).
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- Make the lease lapse at `expires` (ms, server clock), as lifecycle.lapsed says: from
-- `expires` on. Redis keeps a key while its clock has not passed the key's expiry, so the
-- lease key expires one clock step (1 ms) before; the running index scores the call
-- `expires`, and RedisStore.expired lists it as lapsed from that score on.
local function lease_until(expires)
  redis.call('PEXPIREAT', LEASE, expires - 1)
end

-- Whether the lease with this token holds the call (an expired lease key is gone).
local function holds(token)
  return redis.call('HGET', LEASE, 'token') == token
end

-- The holder of the claim `token` lets it go, live or lapsed: a begin with that token no
-- longer claims again (lifecycle.CallState.token).
local function forget(token)
  if redis.call('HGET', SPEC, 'token') == token then
    redis.call('HDEL', SPEC, 'token')
  end
end

-- Free the lease; the call stays in the running index, lapsed for any `now`.
local function drop_lease()
  redis.call('DEL', LEASE)
  redis.call('HDEL', SPEC, 'token')
  redis.call('ZADD', RUNNING, 'XX', 0, CALL)
end

-- Store the call's spec unless known; `rank` is lifecycle.spec_rank of the spec ("0",
-- "1" or "2"), and a spec replaces the stored one as lifecycle.merge_spec says: when it
-- ranks higher, and always at rank 2 (a message as sent). Returns true when the call is new.
local function ensure_spec(json, name, ikey, rank)
  if redis.call('EXISTS', SPEC) == 0 then
    redis.call('HSET', SPEC, 'json', json, 'name', name, 'ikey', ikey, 'req', rank)
    redis.call('ZADD', CALLS, 'NX', (clock()), CALL)
    return true
  end
  if rank == '2' or tonumber(rank) > tonumber(redis.call('HGET', SPEC, 'req') or '0') then
    redis.call('HSET', SPEC, 'json', json, 'name', name, 'ikey', ikey, 'req', rank)
  end
  return false
end

-- The spec in force, if its name and idempotency key (all of it that event data shows)
-- differ from those the payloads were built for; nil when the payloads are right.
local function respec(name, ikey)
  local spec = redis.call('HMGET', SPEC, 'name', 'ikey', 'json')
  if spec[1] == name and (ikey == nil or spec[2] == ikey) then
    return nil
  end
  return spec[3]
end

-- Append the audit event `event` (lifecycle's JSON, id `id`) unless an entry with that id
-- exists. An entry is a JSON object {"id": id, "at": server time "<s>.<us>", "event": the
-- event's JSON as a string}, encoded by cjson: the event's own JSON is kept byte for byte
-- (decoding and re-encoding it in Lua would lose data: cjson turns [] into {} and rounds
-- numbers), and RedisStore.events() stamps it with `at`.
local function push_event(id, event, at)
  for _, e in ipairs(redis.call('LRANGE', EVENTS, 0, -1)) do
    if cjson.decode(e).id == id then return end
  end
  redis.call('RPUSH', EVENTS, cjson.encode({id = id, at = at, event = event}))
end

-- Record the call's one result (`outcome`, with its event), free its lease, drop it from
-- the indexes and keep its keys for `retention` seconds.
local function record(outcome, event_id, event, at, retention)
  redis.call('SET', RESULT, outcome)
  redis.call('DEL', LEASE)
  push_event(event_id, event, at)
  redis.call('ZREM', RUNNING, CALL)
  redis.call('ZREM', UNCLAIMED, CALL)
  for _, key in ipairs({SPEC, ATTEMPTS, RESULT, EVENTS}) do
    redis.call('EXPIRE', key, retention)
  end
end

