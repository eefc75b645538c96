-- lasterror notes the latest failed attempt of a run's step, for Status
-- (LastError): the split's and the reduce's retries, and pages', show
-- while the run goes on, not only in the workers' logs.
-- KEYS[1] run HASH
-- ARGV[1] the step: "split", "reduce" or "page N"
-- ARGV[2] the error, shortened by the caller
-- ARGV[3] the task's nonce: nothing is noted for a task of an earlier
--         attempt of the run, nor for a run that is gone
-- Returns 1 if noted, 0 if not.
if redis.call('HGET', KEYS[1], 'nonce') ~= ARGV[3] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'last_error', ARGV[2], 'last_error_step', ARGV[1], 'last_error_at', now)
return 1
