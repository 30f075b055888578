-- _lib.lua: shared helpers, prepended to every call script (not a script itself; spend.lua,
-- slot.lua and run_*.lua run alone).
--
-- Every call script gets the same KEYS, all under the hash tag {<p>:<shard>} of the call's
-- shard (shard = crc32(call id) % shards, see store.py), so a script touches one hash slot
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
-- is the server's time of an event, kept beside the event's JSON (push_event).
--
-- Plans. begin.lua, finish.lua, record.lua, resolve.lua and lease.lua get lifecycle's writes
-- (lifecycle.Writes, packed by store.py's _pack) with the state they were planned for, and
-- apply them (apply below) only if the call is in it; else they write nothing (but the
-- delivered spec) and reply the state, for Python to plan again (lease.lua replies only that
-- it wrote nothing: the plan for a lease that does not hold is known). They decide nothing:
-- every rule is lifecycle's.

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

-- Append the audit event `event` (lifecycle's JSON, id `id`) unless an entry with that id
-- exists (`fresh`: the caller knows none does, so the trail is not read). An entry is a JSON
-- object {"id": id, "at": server time "<s>.<us>", "event": the event's JSON as a string},
-- encoded by cjson: the event's own JSON is kept byte for byte (decoding and re-encoding it
-- in Lua would lose data: cjson turns [] into {} and rounds numbers), and
-- RedisStore.events() stamps it with `at`.
local function push_event(id, event, at, fresh)
  if not fresh then
    for _, e in ipairs(redis.call('LRANGE', EVENTS, 0, -1)) do
      if cjson.decode(e).id == id then return end
    end
  end
  redis.call('RPUSH', EVENTS, cjson.encode({id = id, at = at, event = event}))
end

-- Write the spec's field, value pairs gathered in `fields`, if any, in one HSET.
local function write_fields(fields)
  if #fields > 0 then
    redis.call('HSET', SPEC, unpack(fields))
  end
end

-- The spec fields to write for a delivered spec (`json`, `name`, `ikey`, its spec_rank `rank`),
-- as lifecycle.merge_spec keeps it, given the stored spec's `name` and `req` (nil: no spec).
-- A new call also enters the shard's calls index at `now`. Appends field, value pairs to
-- `fields`; returns the name and idempotency key of the spec in force afterwards. (Every
-- writer of a spec writes its name: a spec without one is no spec.)
local function merge_fields(fields, json, name, ikey, rank, below, stored_name, stored_ikey, stored_req, now)
  if not stored_name then
    redis.call('ZADD', CALLS, 'NX', now or (clock()), CALL)
  elseif tonumber(stored_req or '0') >= tonumber(below) then  -- not replaced: lifecycle.replaces_below
    return stored_name, stored_ikey
  end
  for _, v in ipairs({'json', json, 'name', name, 'ikey', ikey, 'req', rank}) do
    fields[#fields + 1] = v
  end
  return name, ikey
end

-- Store the call's spec unless known, or replace it as merge_fields says (`now`: the server
-- clock in ms if the caller read it, else read for a new call). Returns true when the call is new.
local function ensure_spec(json, name, ikey, rank, below, now)
  local stored, fields = redis.call('HMGET', SPEC, 'name', 'req'), {}
  merge_fields(fields, json, name, ikey, rank, below, stored[1] or nil, nil, stored[2] or nil, now)
  write_fields(fields)
  return not stored[1]
end

-- The `cause` that the holder of attempt `attempts` recorded with its fenced event, '' if
-- none (lifecycle.CallState.lost_cause; read for a lapsed call only, as the stores do).
local function lost_cause(attempts)
  local fenced = CALL .. ':attempt:' .. attempts .. ':fenced'
  for _, e in ipairs(redis.call('LRANGE', EVENTS, 0, -1)) do
    local entry = cjson.decode(e)
    if entry.id == fenced then
      local data = cjson.decode(entry.event).data
      if type(data) == 'table' and type(data.cause) == 'string' then return data.cause end
    end
  end
  return ''
end

-- Apply a plan (lifecycle.Writes as store.py's _pack lays it out) from ARGV[i] on, in
-- Writes' order, at server time `now` (ms) / `at` (events). Each write is a tag and its fields:
--   'claim', attempt, token, worker, ttl (ms)  the attempt counter, the lease, the spec's token,
--                                              the indexes; the recovery record ends
--                                              (CallWriter.claim)
--   'record', outcome JSON, retention (s)      the one result, the lease freed, the indexes,
--                                              the keys' TTLs (CallWriter.record)
--   'settle', outcome JSON                     replace the recorded result, its TTL kept
--                                              (CallWriter.settle)
--   'event', id, JSON, fresh                   append the event unless its id is in the trail;
--                                              fresh '1': the expected state proves it is not
--                                              (its id is only written with a later attempt's
--                                              claim or with the result), so no scan (CallWriter.append)
--   'let_go', token                            free the lease if this token holds it (CallWriter.let_go)
--   'hand_on', attempt                         the live lease's attempt hands the call on: the
--                                              lease is freed, the call leaves the running index
--                                              for the unclaimed one, scored now, so recovery
--                                              brings it back only once the unclaimed grace has
--                                              passed, and the calls index scores it now (seen
--                                              now: lifecycle.purgeable) (CallWriter.hand_on)
--   'checkpoint', JSON                         the call's last checkpoint, which expires with
--                                              the call's record (CallWriter.checkpoint)
--   'renew', ttl (ms)                          the live lease lapses ttl from now (CallWriter.renew)
-- `fields`: spec field, value pairs still to write, written with the claim's token in one HSET.
-- Returns the claimed lease's expiry (ms), or 0.
local function apply(i, now, at, fields)
  local expires, retention = 0, nil
  while ARGV[i] do
    local op = ARGV[i]
    if op == 'claim' then
      local attempt, token, ttl = ARGV[i + 1], ARGV[i + 2], ARGV[i + 4]
      expires = now + tonumber(ttl)
      redis.call('SET', ATTEMPTS, attempt)
      redis.call('HSET', LEASE, 'token', token, 'worker', ARGV[i + 3], 'attempt', attempt)
      lease_until(expires)
      fields[#fields + 1], fields[#fields + 2] = 'token', token
      redis.call('ZREM', UNCLAIMED, CALL)
      redis.call('ZADD', RUNNING, expires, CALL)
      redis.call('DEL', RECOVERY)  -- claimed: a later crash may be recovered at once
      i = i + 5
    elseif op == 'record' then
      -- only for a call without a result (so no entry has the id of its result event, which
      -- is only ever written with the result, and expires with it)
      retention = ARGV[i + 2]
      redis.call('SET', RESULT, ARGV[i + 1], 'EX', retention)
      redis.call('DEL', LEASE)
      redis.call('ZREM', RUNNING, CALL)
      redis.call('ZREM', UNCLAIMED, CALL)
      i = i + 3
    elseif op == 'settle' then
      redis.call('SET', RESULT, ARGV[i + 1], 'KEEPTTL')
      i = i + 2
    elseif op == 'event' then
      push_event(ARGV[i + 1], ARGV[i + 2], at, ARGV[i + 3] == '1')
      i = i + 4
    elseif op == 'let_go' then
      -- the holder of the claim `token` lets it go, live or lapsed: a begin with that token no
      -- longer claims again (lifecycle.CallState.token)
      local token = ARGV[i + 1]
      if redis.call('HGET', SPEC, 'token') == token then
        redis.call('HDEL', SPEC, 'token')
      end
      if holds(token) then  -- the call stays in the running index, lapsed for any `now`
        redis.call('DEL', LEASE)
        redis.call('HDEL', SPEC, 'token')
        redis.call('ZADD', RUNNING, 'XX', 0, CALL)
      end
      i = i + 2
    elseif op == 'hand_on' then
      redis.call('HSET', SPEC, 'handed_on', ARGV[i + 1])
      redis.call('HINCRBY', SPEC, 'handed', 1)
      redis.call('HDEL', SPEC, 'token')
      redis.call('DEL', LEASE)
      redis.call('ZREM', RUNNING, CALL)
      redis.call('ZADD', UNCLAIMED, now, CALL)
      redis.call('ZADD', CALLS, 'XX', now, CALL)
      i = i + 2
    elseif op == 'checkpoint' then
      redis.call('HSET', SPEC, 'checkpoint', ARGV[i + 1])
      i = i + 2
    elseif op == 'renew' then
      lease_until(now + tonumber(ARGV[i + 1]))
      redis.call('ZADD', RUNNING, 'XX', now + tonumber(ARGV[i + 1]), CALL)
      i = i + 2
    else
      error('unknown write in a plan: ' .. tostring(op))
    end
  end
  write_fields(fields)
  -- A finished call's keys are kept `retention` seconds (its result got them with its SET);
  -- after the event: a TTL is kept by RPUSH, not set on a list not yet made.
  if retention then
    for _, key in ipairs({SPEC, ATTEMPTS, EVENTS}) do
      redis.call('EXPIRE', key, retention)
    end
  end
  return expires
end
