-- finish.lua: apply lifecycle.plan_finish's writes for an attempt's outcome, if the call is in
-- the state they were planned for (a compare-and-set); else reply the state it is in.
--
-- KEYS: the call keys of _lib.lua; KEYS[10], with a copy only: the copy's key.
-- ARGV[1] call id     ARGV[2] CallSpec JSON of a bare call (kept for a call the store does
--   not know, rank 0, as register.lua would)
-- The expected state (as RedisStore.finish sends it):
--   ARGV[3] the recorded result's JSON ('' none)   ARGV[4] the attempt count
--   ARGV[5] name of the spec in force
-- A copy of the accepted success (base.ResultCopy: Celery's result of the call), sent only
-- with a plan that accepts it; '' '' '' for none:
--   ARGV[6] the database it goes to   ARGV[7] its value   ARGV[8] its TTL (s, 0 for none)
-- ARGV[9...] the plan's writes (_lib.lua's apply): to accept 'record' and 'event'; for a
--   stale outcome 'event' (aaa.tool.stale_result) and 'let_go'.
-- Checks, and nothing else: that the result, the attempt count and the spec's name are the
-- ones above. A bare spec is written for an unknown call in either case.
-- Touches: spec (created if unknown), what the writes touch, and the copy's key.
-- Returns {1}: the writes are applied; {1, 1}: and the copy is written; or, having written
--   nothing but a bare spec, {0, result JSON or false, attempts, name}: the state now.

-- Write the copy as Celery's Redis backend writes a result (SET with its expiry, then
-- PUBLISH on the key), in database `db`, last: SELECT changes this script's database only.
-- 1, or 0 if the server refused it (the worker then writes it itself).
local function copy_result(db, value, ttl)
  local key = KEYS[10]
  local function refused(reply) return type(reply) == 'table' and reply.err ~= nil end
  if refused(redis.pcall('SELECT', db)) then return 0 end
  local set
  if ttl > 0 then
    set = redis.pcall('SET', key, value, 'EX', ttl)
  else
    set = redis.pcall('SET', key, value)
  end
  if refused(set) or refused(redis.pcall('PUBLISH', key, value)) then return 0 end
  return 1
end

local now, at = clock()
local name = redis.call('HGET', SPEC, 'name')
local state = redis.call('MGET', RESULT, ATTEMPTS)
local fields = {}
name = merge_fields(fields, ARGV[2], '', '', '0', '0', name, '', '0', now)
local result, attempts = state[1], state[2] or '0'

if ARGV[3] == (result or '') and ARGV[4] == attempts and ARGV[5] == name then
  apply(9, now, at, fields)
  if ARGV[6] ~= '' then
    return {1, copy_result(ARGV[6], ARGV[7], tonumber(ARGV[8]))}
  end
  return {1}
end
write_fields(fields)
return {0, result, attempts, name}
