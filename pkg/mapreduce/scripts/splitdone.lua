-- splitdone records that the split has enqueued every page: it writes the
-- total and moves the run to mapping, or straight to reducing when every
-- page is already recorded (or there are none). Only now can a recorded
-- page be the last one. Pages recorded at or past the total come from an
-- earlier split attempt that emitted more pages: Split was not
-- deterministic and the counts cannot be trusted; the script then changes
-- nothing and replies "nondeterministic", and the caller fails the run.
-- KEYS[1] run       HASH    the run record
-- KEYS[2] recorded  STRING  bitmap of recorded pages
-- ARGV[1] total pages
-- ARGV[2] the run's nonce, as the split task carries it
-- Returns the run's state after the call ("" if the run does not exist),
-- or "nondeterministic".
local run = redis.call('HMGET', KEYS[1], 'state', 'nonce')
local st = run[1]
if not st then
  return ''
end
if st ~= 'splitting' or run[2] ~= ARGV[2] then
  return st
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(ARGV[1])

-- Any bit at or past total? Whole bytes by BITPOS, the partial one by GETBIT.
local extra = false
local first_full = math.ceil(total / 8)
for i = total, first_full * 8 - 1 do
  if redis.call('GETBIT', KEYS[2], i) == 1 then extra = true end
end
if not extra and redis.call('STRLEN', KEYS[2]) > first_full then
  extra = redis.call('BITPOS', KEYS[2], 1, first_full) >= 0
end
if extra then
  return 'nondeterministic'
end

redis.call('HSET', KEYS[1], 'total', total, 'state', 'mapping', 'split_done', now, 'updated', now)
redis.call('HDEL', KEYS[1], 'feeding', 'cursor', 'feeder')
local done = tonumber(redis.call('HGET', KEYS[1], 'done'))
local failed = tonumber(redis.call('HGET', KEYS[1], 'failed'))
if done + failed == total then
  redis.call('HSET', KEYS[1], 'state', 'reducing', 'reducing_at', now)
  return 'reducing'
end
return 'mapping'
