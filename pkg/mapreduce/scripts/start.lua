-- start creates a run, unless a run with the same ID exists (two schedulers
-- on one tick, or a retried Start: one run) or, for a job that forbids
-- overlapping runs, another run of the job is still active.
-- KEYS[1] run      HASH    the run record
-- KEYS[2] runs     ZSET    the job's runs: run ID -> created (ms)
-- KEYS[3] active   STRING  the job's active run ID (jobs without overlap)
-- ARGV[1] run ID
-- ARGV[2] job name
-- ARGV[3] args (encoded)
-- ARGV[4] "1" if runs of this job may overlap
-- ARGV[5] retention (ms): entries older than this leave the runs index
-- ARGV[6] queue
-- Returns {1, ""} created; {0, state} already exists; {-1, activeRunID}
-- refused because another run of the job is active.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local existing = redis.call('HGET', KEYS[1], 'state')
if existing then
  return {0, existing}
end
if ARGV[4] ~= '1' then
  local active = redis.call('GET', KEYS[3])
  if active and active ~= ARGV[1] then
    -- The active run's record shares this hash slot: its key is the run key
    -- with the run ID replaced.
    local other = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1]) .. active
    local st = redis.call('HGET', other, 'state')
    if st == 'splitting' or st == 'mapping' or st == 'reducing' then
      return {-1, active}
    end
  end
  redis.call('SET', KEYS[3], ARGV[1])
end
redis.call('HSET', KEYS[1], 'job', ARGV[2], 'args', ARGV[3], 'state', 'splitting',
  'queue', ARGV[6], 'total', -1, 'done', 0, 'failed', 0,
  'created', now, 'updated', now)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
return {1, ''}
