-- finish.lua: apply lifecycle.plan_finish's writes for an attempt's outcome, if the call is in
-- the state they were planned for (a compare-and-set); else reply the state it is in.
--
-- KEYS: the call keys of _lib.lua.
-- ARGV[1] call id     ARGV[2] CallSpec JSON of a bare call (kept for a call the store does
--   not know, rank 0, as register.lua would)
-- The expected state (as RedisStore.finish sends it):
--   ARGV[3] the recorded result's JSON ('' none)   ARGV[4] the attempt count
--   ARGV[5] name of the spec in force
-- ARGV[6...] the plan's writes (_lib.lua's apply): to accept 'record' and 'event'; for a
--   stale outcome 'event' (aaa.tool.stale_result) and 'let_go'.
-- Checks, and nothing else: that the result, the attempt count and the spec's name are the
-- ones above. A bare spec is written for an unknown call in either case.
-- Touches: spec (created if unknown), and what the writes touch.
-- Returns {1}: the writes are applied; or, having written nothing but a bare spec,
--   {0, result JSON or false, attempts, name}: the state now.

local now, at = clock()
local name = redis.call('HGET', SPEC, 'name')
local state = redis.call('MGET', RESULT, ATTEMPTS)
local fields = {}
name = merge_fields(fields, ARGV[2], '', '', '0', name, '', '0', now)
local result, attempts = state[1], state[2] or '0'

if ARGV[3] == (result or '') and ARGV[4] == attempts and ARGV[5] == name then
  apply(6, now, at, fields)
  return {1}
end
if #fields > 0 then
  redis.call('HSET', SPEC, unpack(fields))
end
return {0, result, attempts, name}
