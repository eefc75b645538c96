-- refresh is the watchdog's one call per interval: it extends the lease of
-- every listed token that holds a permit and the heartbeat of every listed
-- token that waits.
--   ARGV[5] lease (ms)
--   ARGV[6] heartbeat timeout (ms)
--   ARGV[7..] tokens
-- Returns one number per token, in order: its fence (> 0) if it holds a
-- permit (a waiter whose wake message went missing learns of its grant here),
-- 0 if it is queued, -1 if its lease or heartbeat was lost (Redis no longer
-- knows it, or keeps a lapsed permit, marked lost, for its release).
local lease, heartbeat = to_number(ARGV[5]), to_number(ARGV[6])
-- Over maxmemory, Redis refuses a script's first write if it may grow
-- memory (ZADD does), and allows any write after one that cannot (ZREM):
-- this removal of a member no token can be lets the deadlines below move
-- when the script runs by EVALSHA. (As a function it is flagged allow-oom.)
rcall('ZREM', K_HOLDERS, '')
local limit = get_limit()
purge_waiters()
-- Grant first, so that a token granted by this very call reports its fence
-- rather than a stale "queued". The calling process (every token is its
-- own) is alive: its own lapsed holders are kept for it to release (see
-- purge_holders).
local owner = nil
if ARGV[7] then owner = process_of(ARGV[7]) end
grant(limit, purge_holders(owner, lease))
local out = {}
for i = 7, #ARGV do
  local tok = ARGV[i]
  if rcall('ZSCORE', K_HOLDERS, tok) then
    local info = rcall('HGET', K_INFO, tok)
    if is_lost(info) then
      -- Its lease ran out in Redis all the same (Redis's clock jumped, or
      -- the deadline was moved by hand), and a call of this process kept
      -- it, marked lost (purge_holders). The holder must hear it (S4: its
      -- work is cancelled, as Release will call it lost), and the permit
      -- stays taken, not extended, until its process releases it or the
      -- one Lease it was kept for ends.
      out[#out + 1] = -1
    else
      rcall('ZADD', K_HOLDERS, int(now + lease), tok)
      out[#out + 1] = fence_in(info)
    end
  elseif rcall('ZSCORE', K_QUEUE, tok) then
    rcall('ZADD', K_ALIVE, int(now + heartbeat), tok)
    out[#out + 1] = 0
  else
    out[#out + 1] = -1
  end
end
return out
