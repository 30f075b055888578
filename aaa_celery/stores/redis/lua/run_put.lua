-- run_put.lua: write a run's record and keep its shard's indexes in step (stores/runs_redis.py).
--
-- KEYS[1] record   KEYS[2] tenant index   KEYS[3] all-runs index   KEYS[4] active set
-- KEYS[5] events   KEYS[6] turns          KEYS[7] decisions
-- ARGV[1] run id   ARGV[2] record JSON    ARGV[3] started_at (s)   ARGV[4] "1" if still going
-- ARGV[5] retention of a finished run (s)
-- Touches: every key above; a finished run's keys expire after the retention.
-- Returns 1.

redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
if ARGV[4] == '1' then
  redis.call('SADD', KEYS[4], ARGV[1])
  for i = 5, 7 do redis.call('PERSIST', KEYS[i]) end
else
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  for i = 5, 7 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
end
return 1
