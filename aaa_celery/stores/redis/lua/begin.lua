-- begin.lua: apply lifecycle.plan_begin's writes for a delivery of a call, if the call is in
-- the state they were planned for (a compare-and-set); else reply the state it is in.
--
-- KEYS and ARGV[1]: the call keys and the call id (_lib.lua).
-- ARGV[2] the delivered CallSpec JSON    ARGV[3] its name    ARGV[4] its idempotency key
-- ARGV[5] its lifecycle.spec_rank   ARGV[6] its lifecycle.replaces_below (the spec is kept as
--   lifecycle.merge_spec says: merge_fields)
-- The expected state (lifecycle.CallState, as store.py's _expected packs it):
--   ARGV[7] "<attempts>:<handed_on>:<handed>:<live>" (live: 1 if a lease holds the call)
--   ARGV[8] token of the last claim ('' none)   ARGV[9], ARGV[10] name and idempotency key of
--   the spec in force after the merge   ARGV[11] the lost cause ('' none; compared only where
--   it is read: attempts > 0 and no live lease)
-- ARGV[12...] the plan's writes (_lib.lua's apply): for a fresh call 'claim' and 'event'
--   (attempt 1 and its aaa.tool.started event); a refusal 'record' and 'event'.
-- Checks, and nothing else: that no result is recorded and that each of the fields above is
-- what the call's keys hold now. The spec is merged in either case.
-- Touches: spec (created or merged; its token on a claim), and what the writes touch.
-- Returns {1, lease expiry (ms) or 0}: the writes are applied; or, having written nothing but
--   the spec, {0, result JSON or false, attempts, handed_on, handed, token, live lease's
--   worker or '', its expiry (ms) or 0, lost cause, name, idempotency key}: the state now.

local now, at = clock()
local spec = redis.call('HMGET', SPEC, 'name', 'ikey', 'req', 'handed_on', 'handed', 'token')
local counts = redis.call('MGET', ATTEMPTS, RESULT)
local fields = {}
local name, ikey = merge_fields(fields, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], spec[1], spec[2], spec[3], now)

local attempts, result = counts[1] or '0', counts[2]
local pttl = result and -2 or redis.call('PTTL', LEASE)  -- a finished call has no lease
local handed_on, handed, token = spec[4] or '0', spec[5] or '0', spec[6] or ''
local live = pttl ~= -2 and '1' or '0'  -- -2: no lease key (a lapsed lease's key is gone)
local cause = ''
if not result and attempts ~= '0' and live == '0' then
  cause = lost_cause(attempts)
end
if not result and ARGV[7] == attempts .. ':' .. handed_on .. ':' .. handed .. ':' .. live and ARGV[8] == token
    and ARGV[9] == name and ARGV[10] == ikey and ARGV[11] == cause then
  return {1, apply(12, now, at, fields)}
end

write_fields(fields)
local holder, expires = '', 0
if live == '1' then
  -- the key expires 1 ms before the lease lapses (_lib.lua's lease_until)
  holder, expires = redis.call('HGET', LEASE, 'worker') or '', now + math.max(pttl, 0) + 1
end
return {0, result, attempts, handed_on, handed, token, holder, expires, cause, name, ikey}
