-- release gives a token's permit back, or takes a waiter out of the queue,
-- and hands the freed capacity to the queue head(s).
--   ARGV[5] token
--   ARGV[6] (ms) how long the caller's own holders whose lease ran out are
--           kept for it to release (see purge_holders); absent: not kept
-- Returns {was, token, fence, token, fence, ...}: was is 1 if the token held
-- a permit, 2 if it was queued, 0 if Redis knew nothing of it (already
-- released, or its lease or heartbeat ran out: kept for the caller or
-- not); then the grants made to the caller's own waiters (ARGV[4]), which it
-- must hand over itself.
local tok = ARGV[5]
local limit = get_limit()
-- Purge before looking: a token whose lease ran out was lost, not released.
-- The caller's other lost permits stay held until it releases them too.
local keep_ms = tonumber(ARGV[6])
local owner = nil
if SELF ~= '' and keep_ms and keep_ms > 0 then owner = SELF end
local held = purge_holders(owner, keep_ms)
local was = 0
if redis.call('ZREM', K_HOLDERS, tok) == 1 then
  was = 1
  if is_lost(redis.call('HGET', K_INFO, tok)) then was = 0 end
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
