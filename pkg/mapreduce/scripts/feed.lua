-- feed moves a run's window forward: the split has room to enqueue the
-- pages up to (not including) index ARGV[3]. The run counts the pages the
-- split has passed ('fed') and, of those, the pages recorded ('fed_done');
-- their difference is what the run has enqueued or in flight, which the
-- split keeps at most JobOptions.Window. Pages of the new range recorded
-- before (kept by Retry, or by an earlier split attempt) count as done at
-- once. record.lua counts each page it records below 'fed'. 'resume' is
-- where a split attempt that starts again can begin enqueuing: every page
-- below it is enqueued or recorded. The pages between 'resume' and 'fed'
-- are stored in 'feeding' (the pages of the last move, which the split
-- enqueues after it), with the cursor of the last one in 'cursor', so that
-- an attempt that starts again enqueues them and goes on after them.
-- KEYS[1] run       HASH    the run record
-- KEYS[2] recorded  STRING  bitmap of recorded pages
-- ARGV[1] the run's nonce, as the split task carries it
-- ARGV[2] resume: pages below it are enqueued or recorded ("0": no news)
-- ARGV[3] the new end of the fed range ("0": move nothing, read only)
-- ARGV[4] optional: "1" to hand the split on: names a new split task,
--         "split:<resume>.<n>" with n counting the run's hand-ons, so that
--         no two split tasks of a run share an ID, and records it as the
--         run's split task, which the reconciler checks; "" for none
-- ARGV[5] optional: the pages Split expects to emit (ExpectPages); "" for
--         no news
-- ARGV[6] optional, with ARGV[3]: the cursor of page ARGV[3]-1 ("": none)
-- ARGV[7] optional, with ARGV[3]: the encoded pages of the move, stored
--         as 'feeding' if the fed mark moves
-- ARGV[8] optional: the fed mark the move starts from; if the run's is
--         another, another attempt of the split is feeding (or, if the
--         run's is lower, Redis lost the caller's last feeds: restarted
--         from a persistence file that missed them): nothing moves, and
--         the script returns {-2, state, the run's fed mark}
-- ARGV[9] optional, with a move: the step of the split task that feeds
--         ("split", "split:<resume>.<n>", a copy's "…~<seen>"), recorded
--         as the run's split task, which the reconciler checks: an
--         attempt that stopped because this one fed ahead of it is no
--         longer the one to watch
-- ARGV[10] optional, with ARGV[8]: the feeding attempt's token, stored as
--         'feeder' with each move, so that the same feed sent again (its
--         reply was lost, and the call retried) is known for its own and
--         not taken for another attempt's
-- ARGV[11] optional, with a move: the pages a task carries from the first
--         page of the move on (pack.go), set as 'pack', with the old fed
--         mark as 'pack_from', if the run has no 'pack' yet; if it has
--         another, another attempt decided: nothing moves, and the script
--         returns {-2, state}
-- Returns {fed, fed_done, name, map_us, map_n} after the call, name being
-- the new split task's ("" unless handing on) and map_us and map_n what
-- record.lua measured of Map (pack.go), or {-1, state} if the run is not
-- splitting under this nonce (state "" if it does not exist), or {-2,
-- state[, fed]} (ARGV[8], ARGV[11]).
local run = redis.call('HMGET', KEYS[1], 'state', 'nonce', 'fed', 'fed_done', 'resume', 'split_task', 'feeder', 'map_us', 'map_n', 'pack')
if not run[1] then
  return {-1, ''}
end
if run[1] ~= 'splitting' or run[2] ~= ARGV[1] then
  return {-1, run[1]}
end
local fed, done = tonumber(run[3]) or 0, tonumber(run[4]) or 0
if ARGV[8] and ARGV[8] ~= '' and tonumber(ARGV[8]) ~= fed and
    not (run[7] == ARGV[10] and fed == tonumber(ARGV[3])) then
  return {-2, run[1], fed}
end
local to = tonumber(ARGV[3])
if to > fed and ARGV[11] and ARGV[11] ~= '' then
  if not run[10] then
    redis.call('HSET', KEYS[1], 'pack', ARGV[11], 'pack_from', fed)
  elseif run[10] ~= ARGV[11] then
    return {-2, run[1]}
  end
end
if to > fed then
  -- Recorded pages in [fed, to): bits before the first whole byte and
  -- after the last one by GETBIT, whole bytes by BITCOUNT.
  local i = fed
  while i < to and i % 8 ~= 0 do
    done = done + redis.call('GETBIT', KEYS[2], i)
    i = i + 1
  end
  local whole = to - to % 8
  if i < whole then
    done = done + redis.call('BITCOUNT', KEYS[2], string.format('%d', i / 8), string.format('%d', whole / 8 - 1))
    i = whole
  end
  while i < to do
    done = done + redis.call('GETBIT', KEYS[2], i)
    i = i + 1
  end
  fed = to
  redis.call('HSET', KEYS[1], 'fed', ARGV[3], 'fed_done', string.format('%d', done))
  if ARGV[9] and ARGV[9] ~= '' and ARGV[9] ~= (run[6] or 'split') then
    redis.call('HSET', KEYS[1], 'split_task', ARGV[9])
  end
  if ARGV[10] then
    redis.call('HSET', KEYS[1], 'feeder', ARGV[10])
  end
  if ARGV[7] then
    redis.call('HSET', KEYS[1], 'feeding', ARGV[7])
    if ARGV[6] ~= '' then
      redis.call('HSET', KEYS[1], 'cursor', ARGV[6])
    else
      redis.call('HDEL', KEYS[1], 'cursor')
    end
  end
end
local resume = run[5] or '0'
-- Never past the fed mark: a split whose last feeds Redis lost (a restart
-- from a file that missed them) would otherwise move resume past pages
-- whose tasks were lost with them.
if tonumber(ARGV[2]) > tonumber(resume) and tonumber(ARGV[2]) <= fed then
  resume = ARGV[2]
  redis.call('HSET', KEYS[1], 'resume', resume)
end
local name = ''
if ARGV[4] == '1' then
  local n = redis.call('HINCRBY', KEYS[1], 'handoffs', 1)
  name = 'split:' .. resume .. '.' .. string.format('%d', n)
  redis.call('HSET', KEYS[1], 'split_task', name)
end
if ARGV[5] and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'expected', ARGV[5])
end
return {fed, done, name, tonumber(run[8]) or 0, tonumber(run[9]) or 0}
