-- splitdone records that the split has enqueued every page: it writes the
-- total and moves the run to mapping, or straight to reducing when every
-- page is already recorded (or there are none). Only now can a recorded
-- page be the last one.
-- KEYS[1] run  HASH  the run record
-- ARGV[1] total pages
-- Returns the run's state after the call ("" if the run does not exist).
local st = redis.call('HGET', KEYS[1], 'state')
if not st then
  return ''
end
if st ~= 'splitting' then
  return st
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'total', total, 'state', 'mapping', 'split_done', now, 'updated', now)
local done = tonumber(redis.call('HGET', KEYS[1], 'done'))
local failed = tonumber(redis.call('HGET', KEYS[1], 'failed'))
if done + failed == total then
  redis.call('HSET', KEYS[1], 'state', 'reducing', 'reducing_at', now)
  return 'reducing'
end
return 'mapping'
