-- acquire takes a permit for a token at once, or queues the token.
-- Idempotent: a retried call with the same token returns the same outcome.
--   ARGV[4] token
--   ARGV[5] lease (ms)
--   ARGV[6] heartbeat timeout (ms) of a queued waiter
--   ARGV[7] "1" to queue when the permit is not free, "0" to return instead
-- Returns {status, value, limit}:
--   { 1, fence,  limit}  granted
--   { 0, ticket, limit}  queued; the grant arrives on the process's wake list
--   { 2, 0,      limit}  not free and ARGV[7] == "0"
--   {-1, 0,      limit}  the weight exceeds the limit: never grantable
local tok = ARGV[4]
local lease, heartbeat = tonumber(ARGV[5]), tonumber(ARGV[6])

local limit = get_limit()
purge()
local held = grant(limit)

if redis.call('ZSCORE', K_HOLDERS, tok) then
  return {1, fence_of(tok), limit}
end
local ticket = redis.call('ZSCORE', K_QUEUE, tok)
if ticket then
  return {0, tonumber(ticket), limit}
end

local w = weight_of(tok)
if w > limit then
  return {-1, 0, limit}
end
if redis.call('ZCARD', K_QUEUE) == 0 and held + w <= limit then
  return {1, add_holder(tok, now + lease), limit}
end
if ARGV[7] ~= '1' then
  return {2, 0, limit}
end
ticket = redis.call('INCR', K_TICKET)
redis.call('ZADD', K_QUEUE, ticket, tok)
redis.call('ZADD', K_ALIVE, now + heartbeat, tok)
redis.call('HSET', K_INFO, tok, now)
return {0, ticket, limit}
