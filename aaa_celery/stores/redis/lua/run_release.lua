-- run_release.lua: give a run's lease back, if the holder holds it.
--
-- KEYS[1] lease
-- ARGV[1] holder
-- Returns 1 if released, else 0.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
