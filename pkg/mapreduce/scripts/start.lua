-- start creates a run, unless a run with the same ID exists (two schedulers
-- on one tick, or a retried Start: one run) or, for a job that forbids
-- overlapping runs, another run of the job is still active.
-- KEYS[1] run      HASH    the run record
-- KEYS[2] runs     ZSET    the job's runs: run ID -> created (ms)
-- KEYS[3] active   STRING  the job's active run ID (jobs without overlap)
-- KEYS[4] unfinished ZSET  the job's runs that have not ended: run ID ->
--                          created (ms); what the reconciler reads
-- ARGV[1] run ID
-- ARGV[2] job name
-- ARGV[3] args (encoded)
-- ARGV[4] "1" if runs of this job may overlap
-- ARGV[5] retention (ms): kept in the run, so that any process can end it
--         (finish.lua); entries older than this leave the runs index
-- ARGV[6] queue
-- ARGV[7] nonce: a fresh random string, part of the run's task IDs, so that
--         a run started again under the same ID after the first one expired
--         never collides with the first one's tasks still kept by asynq
-- ARGV[8] pages per bundle of small results (record.lua), kept in the run
-- Returns {1, "", nonce} created; {0, state, nonce} already exists;
-- {-1, activeRunID, ""} refused because another run of the job is active.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Every run of the job has its record under this prefix (KEYS[1] is the
-- prefix followed by the run ID), in this hash slot.
local run_prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1])
local existing = redis.call('HMGET', KEYS[1], 'state', 'nonce')
if existing[1] then
  return {0, existing[1], existing[2] or ''}
end
if ARGV[4] ~= '1' then
  local active = redis.call('GET', KEYS[3])
  if active and active ~= ARGV[1] then
    local st = redis.call('HGET', run_prefix .. active, 'state')
    if st == 'splitting' or st == 'mapping' or st == 'reducing' then
      return {-1, active, ''}
    end
  end
  redis.call('SET', KEYS[3], ARGV[1])
end
redis.call('HSET', KEYS[1], 'job', ARGV[2], 'args', ARGV[3], 'state', 'splitting',
  'queue', ARGV[6], 'nonce', ARGV[7], 'retention', ARGV[5], 'total', -1, 'done', 0, 'failed', 0,
  'created', now, 'updated', now, 'packed', ARGV[8])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
-- Forget runs older than the retention whose records have expired; a run
-- that is older but still going stays listed (and reconciled).
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]), 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  if redis.call('EXISTS', run_prefix .. id) == 0 then
    redis.call('ZREM', KEYS[2], id)
  end
end
return {1, '', ARGV[7]}
