-- release gives a token's permit back, or takes a waiter out of the queue,
-- and hands the freed capacity to the queue head(s).
--   ARGV[5] token
-- Returns {was, token, fence, token, fence, ...}: was is 1 if the token held
-- a permit, 2 if it was queued, 0 if Redis knew nothing of it (already
-- released, or its lease or heartbeat ran out); then the grants made to the
-- caller's own waiters (ARGV[4]), which it must hand over itself.
local tok = ARGV[5]
local limit = get_limit()
-- Purge before looking: a token whose lease ran out was lost, not released.
local held = purge_holders()
local was = 0
if redis.call('ZREM', K_HOLDERS, tok) == 1 then
  was = 1
  holder_removed(tok)
  redis.call('HDEL', K_INFO, tok)
  held = held - weight_of(tok)
elseif redis.call('ZSCORE', K_QUEUE, tok) then
  was = 2
  drop_waiter(tok)
end
grant(limit, held)
local out = {was}
for _, v in ipairs(LOCAL_GRANTS) do
  out[#out + 1] = v
end
return out
