-- record stores the outcomes of one or more pages of a run (the pages of
-- one map task), each exactly once: a page already recorded (a duplicate
-- delivery, a retry after a crash) changes nothing. The call that records
-- the last page of a run whose split has ended moves the run to reducing;
-- the caller then enqueues the reduce task. While the split is still
-- emitting, the total is unknown and no call can be the last.
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
-- ARGV[1] the run's nonce, as the page's task carries it: a task of an
--         earlier run under the same ID records nothing
-- ARGV[2] microseconds that Map took over the pages of ARGV[3] ("0":
--         none measured), added to the run's 'map_us' and 'map_n', from
--         which the split decides how many pages a task carries (feed.lua)
-- ARGV[3] how many pages ARGV[2] measured
-- ARGV[4], ARGV[5], ARGV[6], then ARGV[7]... in threes, one three a page:
--         the page index; its encoded result, or encoded failure; "1" if
--         the page failed for good
-- A page recorded below the split's fed mark leaves the run's window
-- (feed.lua): 'fed_done' counts it.
-- Returns {recorded, state}: recorded is how many pages this call
-- recorded (0 if all were recorded before or the run no longer takes
-- results); state is the run's state after the call ("" if the run does
-- not exist).
if KEYS[5] then
  redis.call('DEL', KEYS[5])
end
local run = redis.call('HMGET', KEYS[1], 'state', 'nonce', 'total', 'done', 'failed', 'fed', 'fed_done', 'packed', 'map_us', 'map_n')
local st = run[1]
if not st then
  return {0, ''}
end
if run[2] ~= ARGV[1] then
  return {0, st}
end
if st ~= 'splitting' and st ~= 'mapping' then
  return {0, st}
end
local total = tonumber(run[3])
local done, failed = tonumber(run[4]) or 0, tonumber(run[5]) or 0
local fed, fed_done = tonumber(run[6]), tonumber(run[7]) or 0
local packed = tonumber(run[8])
if not (packed and packed >= 1 and packed <= 256) then
  packed = nil
end
local results, fails, bundles = {}, {}, {}
local n = 0
for a = 4, #ARGV, 3 do
  local i = tonumber(ARGV[a])
  -- i >= total in a mapping run: a page of an earlier split attempt that
  -- emitted more.
  if not (st == 'mapping' and i >= total) and redis.call('SETBIT', KEYS[2], i, 1) == 0 then
    n = n + 1
    local outcome = ARGV[a + 1]
    if ARGV[a + 2] == '1' then
      fails[#fails + 1], fails[#fails + 2] = ARGV[a], outcome
      failed = failed + 1
    else
      if packed and #outcome <= 64 then
        local field = 'b' .. string.format('%d', math.floor(i / packed))
        local entry = string.char(i % packed, #outcome) .. outcome
        if bundles[field] then
          bundles[field] = bundles[field] .. entry
        else
          bundles[field] = (redis.call('HGET', KEYS[3], field) or '') .. entry
        end
      else
        results[#results + 1], results[#results + 2] = ARGV[a], outcome
      end
      done = done + 1
    end
    -- The page leaves the split's window (feed.lua). A run created before
    -- windows has no 'fed': its pages were all enqueued at once.
    if fed and i < fed then
      fed_done = fed_done + 1
    end
  end
end
if n == 0 then
  return {0, st}
end
for field, bundle in pairs(bundles) do
  results[#results + 1], results[#results + 2] = field, bundle
end
if #results > 0 then
  redis.call('HSET', KEYS[3], unpack(results))
end
if #fails > 0 then
  redis.call('HSET', KEYS[4], unpack(fails))
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The run's counters move in one HSET, from the values read above.
local fields = {'updated', now, 'done', done, 'failed', failed}
if fed then
  fields[#fields + 1], fields[#fields + 2] = 'fed_done', fed_done
end
if tonumber(ARGV[3]) > 0 then
  fields[#fields + 1], fields[#fields + 2] = 'map_us', (tonumber(run[9]) or 0) + tonumber(ARGV[2])
  fields[#fields + 1], fields[#fields + 2] = 'map_n', (tonumber(run[10]) or 0) + tonumber(ARGV[3])
end
if st == 'mapping' and done + failed == total then
  st = 'reducing'
  fields[#fields + 1], fields[#fields + 2] = 'state', st
  fields[#fields + 1], fields[#fields + 2] = 'reducing_at', now
end
redis.call('HSET', KEYS[1], unpack(fields))
return {n, st}
