-- spend.lua: spend an amount against a budget's limit in the current window, once per token
-- (the rule of stores/budgets.py; this script only makes it atomic). Not prepended with
-- _lib.lua: it touches no call keys.
--
-- KEYS[1] <p>:budget:{<digest of the budget key>}   hash: window (its number), total (the
--         amount spent in it), t:<token> (what each token spent); expires after its window.
-- ARGV[1] token     ARGV[2] amount     ARGV[3] limit     ARGV[4] window (ms)
-- ARGV[5] epsilon (stores/budgets.EPSILON)
-- Returns 1 if the amount is counted (or this token was counted in this window already),
-- else 0 and nothing is written. The window comes from the server's clock.

local budget = KEYS[1]
local token = 't:' .. ARGV[1]
local amount, limit, window_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now_ms / window_ms)
if tonumber(redis.call('HGET', budget, 'window') or '-1') ~= window then
  redis.call('DEL', budget)
  redis.call('HSET', budget, 'window', string.format('%d', window), 'total', '0')
  redis.call('PEXPIREAT', budget, string.format('%d', (window + 1) * window_ms + 1000))
end
if redis.call('HEXISTS', budget, token) == 1 then
  return 1
end
local total = tonumber(redis.call('HGET', budget, 'total'))
if total + amount > limit + tonumber(ARGV[5]) * math.max(1, math.abs(limit)) then
  return 0
end
redis.call('HINCRBYFLOAT', budget, 'total', ARGV[2])
redis.call('HSET', budget, token, ARGV[2])
return 1
