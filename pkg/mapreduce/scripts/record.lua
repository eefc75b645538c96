-- record stores one page's outcome, exactly once: a page already recorded
-- (a duplicate delivery, a retry after a crash) changes nothing. The call
-- that records the last page of a run whose split has ended moves the run
-- to reducing; the caller then enqueues the reduce task. While the split
-- is still emitting, the total is unknown and no call can be the last.
-- KEYS[1] run       HASH    the run record
-- KEYS[2] recorded  STRING  bitmap: bit i set once page i is recorded
-- KEYS[3] results   HASH    page index -> encoded result; in a run whose
--                           record has 'packed' (its pages per bundle,
--                           start.lua), a result of at most 64 bytes goes
--                           instead into field "b<index / packed>", a
--                           bundle of entries <index % packed><length>
--                           <bytes> (one byte each for the first two), so
--                           that a small result costs a few bytes rather
--                           than a hash entry's ~60 (reduce.go reads both)
-- KEYS[4] failures  HASH    page index -> encoded {page, error}
-- KEYS[5] claim     STRING  optional: the mark of the handler's attempt
--                           (orphans.go), deleted: its work is done
-- ARGV[1] page index
-- ARGV[2] encoded result, or encoded failure
-- ARGV[3] "1" if the page failed for good
-- ARGV[4] the run's nonce, as the page's task carries it: a task of an
--         earlier run under the same ID records nothing
-- A page recorded below the split's fed mark leaves the run's window
-- (feed.lua): 'fed_done' counts it.
-- Returns {recorded, state}: recorded is 1 if this call recorded the page,
-- 0 if it was recorded before or the run no longer takes results; state is
-- the run's state after the call ("" if the run does not exist).
if KEYS[5] then
  redis.call('DEL', KEYS[5])
end
local run = redis.call('HMGET', KEYS[1], 'state', 'nonce', 'total', 'done', 'failed', 'fed', 'fed_done', 'packed')
local st = run[1]
if not st then
  return {0, ''}
end
if run[2] ~= ARGV[4] then
  return {0, st}
end
if st ~= 'splitting' and st ~= 'mapping' then
  return {0, st}
end
local i, total = tonumber(ARGV[1]), tonumber(run[3])
if st == 'mapping' and i >= total then
  return {0, st} -- a page of an earlier split attempt that emitted more
end
if redis.call('SETBIT', KEYS[2], i, 1) == 1 then
  return {0, st}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local done, failed = tonumber(run[4]) or 0, tonumber(run[5]) or 0
-- The run's counters move in one HSET, from the values read above.
local fields = {'updated', now}
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
  failed = failed + 1
  fields[#fields + 1], fields[#fields + 2] = 'failed', failed
else
  local packed = tonumber(run[8])
  if packed and packed >= 1 and packed <= 256 and #ARGV[2] <= 64 then
    local field = 'b' .. string.format('%d', math.floor(i / packed))
    local bundle = redis.call('HGET', KEYS[3], field) or ''
    redis.call('HSET', KEYS[3], field, bundle .. string.char(i % packed, #ARGV[2]) .. ARGV[2])
  else
    redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
  end
  done = done + 1
  fields[#fields + 1], fields[#fields + 2] = 'done', done
end
-- The page leaves the split's window (feed.lua). A run created before
-- windows has no 'fed': its pages were all enqueued at once.
local fed = tonumber(run[6])
if fed and i < fed then
  fields[#fields + 1], fields[#fields + 2] = 'fed_done', (tonumber(run[7]) or 0) + 1
end
local last = st == 'mapping' and done + failed == total
if last then
  st = 'reducing'
  fields[#fields + 1], fields[#fields + 2] = 'state', st
  fields[#fields + 1], fields[#fields + 2] = 'reducing_at', now
end
redis.call('HSET', KEYS[1], unpack(fields))
return {1, st}
