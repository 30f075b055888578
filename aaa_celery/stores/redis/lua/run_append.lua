-- run_append.lua: append a run's events in order, each once (stores/runs_redis.py).
--
-- KEYS[1] events   KEYS[2] record
-- ARGV: pairs of (seq, event JSON)
-- Touches: events; an event is pushed only if its seq is the next one (a retry writes nothing).
-- Returns the number of events after the append (0 for an unknown run).

if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
local n = redis.call('LLEN', KEYS[1])
for i = 1, #ARGV, 2 do
  if tonumber(ARGV[i]) == n + 1 then
    redis.call('RPUSH', KEYS[1], ARGV[i + 1])
    n = n + 1
  end
end
local ttl = redis.call('TTL', KEYS[2])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return n
