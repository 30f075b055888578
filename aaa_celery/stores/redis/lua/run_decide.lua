-- run_decide.lua: record a decision on one request for approval, first writer wins.
--
-- KEYS[1] decisions   KEYS[2] record
-- ARGV[1] field (call id and digest)   ARGV[2] decision JSON
-- Returns 1 if this decision was recorded, 0 if the request was decided already or the run is unknown.

if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
