-- run_turn.lua: record the model's answer of a run's turn, first writer wins (stores/redis/runs.py).
--
-- KEYS[1] turns   KEYS[2] record
-- ARGV[1] turn   ARGV[2] the answer's JSON
-- Touches: turns (its TTL follows the record's, as the events').
-- Returns the answer recorded for the turn, or false for an unknown run (nothing written).

if redis.call('EXISTS', KEYS[2]) == 0 then
  return false
end
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
local ttl = redis.call('TTL', KEYS[2])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return redis.call('HGET', KEYS[1], ARGV[1])
