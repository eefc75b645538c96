-- acquire takes a permit for a token at once, or queues the token.
-- Idempotent when the caller says it retries (ARGV[9]): a retried call with
-- the same token returns the same outcome, with its deadline re-armed (the
-- caller dates its lease or heartbeat from the retry, not from the call
-- whose reply it lost).
--   ARGV[5] token
--   ARGV[6] lease (ms)
--   ARGV[7] heartbeat timeout (ms) of a queued waiter
--   ARGV[8] "1" to queue when the permit is not free, "0" to return instead
--   ARGV[9] "1" if an earlier call with this token may have run (a retry);
--           "0" says that none did: a record of the token is then a
--           tombstone (bury, lib.lua), and the call takes nothing
-- Returns {status, value, limit}:
--   { 1, fence,  limit}  granted
--   { 0, ticket, limit}  queued; the grant arrives on the process's wake list
--   { 2, 0,      limit}  not free and ARGV[8] == "0"
--   {-1, 0,      limit}  the weight exceeds the limit (in auto mode, the
--                        max the limit may rise to): never grantable
--   { 3, 0,      limit}  a retry of a token Redis does not know, or whose
--                        permit lapsed, or a first call of a token its
--                        process gave up: ask again under a new token
local tok = ARGV[5]
local lease, heartbeat = to_number(ARGV[6]), to_number(ARGV[7])
-- A first call's token is unknown to Redis (fresh, or carried by a release
-- that Redis refused before it ran: enqueue.go), unless its process gave
-- it up before the call landed: only a retry can find its token already
-- holding or queued.
local retry = ARGV[9] == '1'

local limit = get_limit()
-- The calling process is alive: its own lapsed holders are kept for it to
-- release (see purge_holders).
local held, queue_empty = grant(limit, purge_holders(process_of(tok), lease))
local w = weight_of(tok)

-- A retry of a token Redis does not know: either the earlier call never
-- ran, or it did and the place or permit it got has lapsed since (the
-- reply was lost while the process was cut off). In the second case a
-- wake-up for that place may still sit in the process's wake list; a new
-- place under the same token would make it look like this place's grant.
-- The caller asks again under a new token instead. (One token, one place.)
-- So too when the permit it got lapsed and is kept for this process,
-- marked lost (purge_holders, above): its lease was lost, the caller never
-- had it, and the release of the old token that follows gives it back.
if retry then
  local info = rcall('HGET', K_INFO, tok)
  if not info or is_lost(info) or info == GONE then
    return {3, 0, limit}
  end
end

-- A first call for a token that has a heartbeat entry takes nothing: its
-- process gave the token up before the call landed (bury, lib.lua: a
-- tombstone has one), or a copy of the call queued it already. Its caller,
-- if it still waits, asks again under a new token. (One token, one place.)
-- Where it queues, the heartbeat it writes anyway tells (ZADD NX, below);
-- where it is granted at once, the queue is empty, so the heartbeats it
-- looks in are the tombstones' alone. (A copy of a call that was granted
-- is not told apart: the semaphore sends a first call once, sentOnce in
-- calls.go, so that no copy exists.)

if queue_empty and held + w <= limit then
  if not retry and rcall('ZSCORE', K_ALIVE, tok) then
    return {3, 0, limit}
  end
  -- The fast path: one ZADD NX both grants and detects a retry.
  if rcall('ZADD', K_HOLDERS, 'NX', int(now + lease), tok) == 1 then
    local fence = rcall('INCR', K_FENCE)
    local fence_s = int(fence)
    holder_added(tok, fence_s)
    rcall('HSET', K_INFO, tok, fence_s .. ':' .. now_s)
    return {1, fence, limit}
  end
  rcall('ZADD', K_HOLDERS, int(now + lease), tok)
  return {1, fence_of(tok), limit}
end

-- A retry of a call that ran: already holding, or already queued. (A
-- retry's token has an info entry, or it returned above.)
if retry then
  if rcall('ZSCORE', K_HOLDERS, tok) then
    rcall('ZADD', K_HOLDERS, int(now + lease), tok)
    return {1, fence_of(tok), limit}
  end
  local ticket = rcall('ZSCORE', K_QUEUE, tok)
  if ticket then
    rcall('ZADD', K_ALIVE, int(now + heartbeat), tok)
    return {0, to_number(ticket), limit}
  end
end

local heavy = heavy_bound(limit)
if w > heavy then
  return {-1, 0, heavy}
end
if ARGV[8] ~= '1' then
  return {2, 0, limit}
end
if retry then
  rcall('ZADD', K_ALIVE, int(now + heartbeat), tok)
elseif rcall('ZADD', K_ALIVE, 'NX', int(now + heartbeat), tok) == 0 then
  return {3, 0, limit} -- known already: see above
end
local ticket = rcall('INCR', K_TICKET)
rcall('ZADD', K_QUEUE, int(ticket), tok)
rcall('HSET', K_INFO, tok, now_s)
return {0, ticket, limit}
