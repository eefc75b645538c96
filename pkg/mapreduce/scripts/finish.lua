-- finish ends a run, once: succeeded or failed (from the reduce step, or a
-- split or run that cannot go on), or cancelled. A run that has already
-- ended keeps its outcome, so a duplicate reduce cannot overwrite the first
-- one's result. Every key of the run then expires after the retention.
-- A step of an earlier attempt of a run that Retry resumed (its nonce is
-- not the run's) ends nothing.
-- KEYS[1] run       HASH
-- KEYS[2] recorded  STRING
-- KEYS[3] results   HASH
-- KEYS[4] failures  HASH
-- KEYS[5] active    STRING  the job's active run ID
-- KEYS[6] unfinished ZSET   the job's runs that have not ended (start.lua)
-- ARGV[1] run ID
-- ARGV[2] new state: succeeded, failed or cancelled
-- ARGV[3] encoded result ("" for none)
-- ARGV[4] error message ("" for none)
-- ARGV[5] the state the run must be in, or "" for any unfinished state
-- ARGV[6] "1" if ARGV[3] is a result (which may be empty bytes)
-- ARGV[7] the nonce of the attempt the caller acts on (its task's, or the
--         one the reconciler read), or "" for any: Cancel
-- The keys expire after the retention that start.lua kept in the run (24 h
-- for a run created before it did).
-- Returns {1, state} if this call ended the run, {0, state} otherwise,
-- state being the run's state after the call ("" if it does not exist).
local run = redis.call('HMGET', KEYS[1], 'state', 'nonce')
local st = run[1]
if not st then
  return {0, ''}
end
if st == 'succeeded' or st == 'failed' or st == 'cancelled' then
  return {0, st}
end
if (ARGV[5] ~= '' and st ~= ARGV[5]) or (ARGV[7] ~= '' and run[2] ~= ARGV[7]) then
  return {0, st}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'finished', now, 'updated', now)
redis.call('HDEL', KEYS[1], 'feeding', 'cursor', 'feeder') -- a split's pages in flight: no split goes on
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'result', ARGV[3])
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'error', ARGV[4])
end
local ttl = tonumber(redis.call('HGET', KEYS[1], 'retention')) or 86400000
for i = 1, 4 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
if redis.call('GET', KEYS[5]) == ARGV[1] then
  redis.call('DEL', KEYS[5])
end
redis.call('ZREM', KEYS[6], ARGV[1])
return {1, ARGV[2]}
