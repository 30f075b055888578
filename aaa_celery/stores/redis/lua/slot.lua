-- slot.lua: apply lifecycle.plan_slot's plan to a concurrency key's holders if they are as
-- they were read, else return them as they are now, for Python to plan again (a
-- compare-and-set: the rule is planned in Python; this script only makes it atomic). Not
-- prepended with _lib.lua: it touches no call keys.
--
-- KEYS[1] <p>:slot:{<digest of the slot key>}   sorted set: each holder's call id, scored by
--         its slot's expiry (ms, server clock); expires a second after its last holder's.
-- ARGV[1] the holders as the plan read them (their ZRANGE WITHSCORES joined by newlines;
--         "?" before any read: nothing is written, the holders are returned)
-- ARGV[2] the call id     ARGV[3] the plan's expiry for it (ms; "": nothing to write)
-- ARGV[4...] the holders the plan drops (their slot lapsed)
-- Returns {"done"} having applied the plan; or {"read", now (ms), holders (ZRANGE WITHSCORES)}
-- having written nothing: the holders changed since they were read (or were never read).

local slots = KEYS[1]
local held = redis.call('ZRANGE', slots, 0, -1, 'WITHSCORES')
if ARGV[1] ~= table.concat(held, '\n') then
  local t = redis.call('TIME')
  return {'read', tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), held}
end
for i = 4, #ARGV do
  redis.call('ZREM', slots, ARGV[i])
end
if ARGV[3] ~= '' then
  redis.call('ZADD', slots, ARGV[3], ARGV[2])
end
local last = redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')
if #last == 0 then
  redis.call('DEL', slots)
else
  redis.call('PEXPIREAT', slots, math.floor(tonumber(last[2])) + 1000)
end
return {'done'}
