-- release gives a token's permit back, or takes a waiter out of the queue,
-- and hands the freed capacity to the queue head(s).
--   ARGV[4] token
-- Returns 1 if the token held a permit, 2 if it was queued, 0 if Redis knew
-- nothing of it (already released, or its lease or heartbeat ran out).
local tok = ARGV[4]
local limit = get_limit()
purge()
local was = 0
if redis.call('ZREM', K_HOLDERS, tok) == 1 then
  was = 1
  redis.call('HDEL', K_INFO, tok)
elseif redis.call('ZSCORE', K_QUEUE, tok) then
  was = 2
  drop_waiter(tok)
end
grant(limit)
return was
