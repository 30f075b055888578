-- spend.lua: apply lifecycle.plan_spend's plan to a budget if the budget is as it was read,
-- else return it as it is now, for Python to plan again (a compare-and-set: the rule is
-- planned in Python; this script only makes it atomic). Not prepended with _lib.lua: it
-- touches no call keys.
--
-- KEYS[1] <p>:budget:{<digest of the budget key>}   hash: window (its number), total (the
--         amount spent in it), t:<token> (what each token spent); expires after its window.
-- ARGV[1] token     ARGV[2] the window's length (s, as Python's repr of a float)
-- ARGV[3] the budget as the plan read it, "<window> <total> <counted>" ("-" for a missing
--         field; "?" before any read: nothing is written, the state is returned)
-- ARGV[4] the plan's window     ARGV[5] "1": empty the budget first (a new window)
-- ARGV[6] the amount to count for the token ("": none)     ARGV[7] when the budget's
--         key expires (ms, server clock: a second after its window ends)
-- Returns {"done", window, total} having applied the plan (the budget as it left it); or {"read", now (ms), window, total, counted}
-- having written nothing: the budget changed since it was read (or was never read), or the
-- server's clock has left the plan's window (lifecycle.window_of, on now / 1000).

local budget = KEYS[1]
local token = 't:' .. ARGV[1]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local found = redis.call('HMGET', budget, 'window', 'total')
local counted = redis.call('HEXISTS', budget, token)
local seen = (found[1] or '-') .. ' ' .. (found[2] or '-') .. ' ' .. counted
if ARGV[3] ~= seen or math.floor((now_ms / 1000) / tonumber(ARGV[2])) ~= tonumber(ARGV[4]) then
  return {'read', tostring(now_ms), found[1] or '-', found[2] or '-', counted}
end
if ARGV[5] == '1' then
  redis.call('DEL', budget)
  redis.call('HSET', budget, 'window', ARGV[4], 'total', '0')
  redis.call('PEXPIREAT', budget, ARGV[7])
end
if ARGV[6] ~= '' then
  redis.call('HINCRBYFLOAT', budget, 'total', ARGV[6])
  redis.call('HSET', budget, token, ARGV[6])
end
local after = redis.call('HMGET', budget, 'window', 'total')
return {'done', after[1], after[2]}
