-- retry resumes a run that failed or was cancelled: the pages that failed
-- for good are forgotten (their bits cleared, their failures deleted), so
-- that the split, which runs again, enqueues them with the pages that never
-- finished; pages that succeeded keep their results and are not enqueued.
-- The run gets a new nonce: every task of its earlier attempt (a retry, a
-- duplicate, an archived task re-run from asynq, a handler still at work)
-- then records nothing, and the new tasks' IDs do not collide with the
-- earlier ones that asynq keeps. The keys that finish.lua set to expire
-- stay until the run ends again. A job that forbids overlapping runs is
-- refused while another of its runs is active, as start.lua does.
-- KEYS[1] run       HASH    the run record
-- KEYS[2] recorded  STRING  bitmap of recorded pages
-- KEYS[3] results   HASH    page index -> encoded result
-- KEYS[4] failures  HASH    page index -> encoded {page, error}
-- KEYS[5] active    STRING  the job's active run ID (jobs without overlap)
-- KEYS[6] transient HASH    transient failures per step: forgotten, so that
--                           the resumed run rides out outages afresh
-- KEYS[7] unfinished ZSET   the job's runs that have not ended (start.lua):
--                           the resumed run is one again
-- ARGV[1] run ID
-- ARGV[2] "1" if runs of this job may overlap
-- ARGV[3] the new nonce
-- Returns {"resumed", failed pages forgotten, pages kept, retries so far};
-- {"missing", ""} if the run does not exist; {"state", state} if it has
-- not ended or it succeeded; {"active", activeRunID} if refused because
-- another run of the job is active. Only "resumed" changes anything.
local run = redis.call('HMGET', KEYS[1], 'state', 'done')
local st = run[1]
if not st then
  return {'missing', ''}
end
if st ~= 'failed' and st ~= 'cancelled' then
  return {'state', st}
end
if ARGV[2] ~= '1' then
  -- Every run of the job has its record under this prefix (KEYS[1] is the
  -- prefix followed by the run ID), in this hash slot.
  local run_prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1])
  local active = redis.call('GET', KEYS[5])
  if active and active ~= ARGV[1] then
    local other = redis.call('HGET', run_prefix .. active, 'state')
    if other == 'splitting' or other == 'mapping' or other == 'reducing' then
      return {'active', active}
    end
  end
  redis.call('SET', KEYS[5], ARGV[1])
end
local failed = redis.call('HKEYS', KEYS[4])
for _, i in ipairs(failed) do
  redis.call('SETBIT', KEYS[2], tonumber(i), 0)
end
redis.call('UNLINK', KEYS[4], KEYS[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HDEL', KEYS[1], 'error', 'result', 'finished', 'split_done', 'reducing_at', 'fed', 'fed_done', 'resume', 'split_task', 'handoffs', 'expected', 'cursor', 'feeding', 'feeder',
  'pack', 'pack_from',
  'last_error', 'last_error_step', 'last_error_at')
local retries = redis.call('HINCRBY', KEYS[1], 'retries', 1)
-- retried_done: "retries:pages kept", so that a rate counts only the pages
-- done since; the retry count tells a note left by an earlier retry from
-- this one's, when a release that writes none retried the run since.
redis.call('HSET', KEYS[1], 'state', 'splitting', 'nonce', ARGV[3], 'total', -1, 'failed', 0,
  'retried', now, 'retried_done', retries .. ':' .. (tonumber(run[2]) or 0), 'updated', now)
for i = 1, 3 do
  redis.call('PERSIST', KEYS[i])
end
redis.call('ZADD', KEYS[7], tonumber(redis.call('HGET', KEYS[1], 'created')) or now, ARGV[1])
return {'resumed', #failed, tonumber(run[2]) or 0, retries}
