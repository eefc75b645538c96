-- stats returns a consistent snapshot, after purging the dead.
-- Returns {limit, now,
--          {holderToken, leaseDeadline, info, ...},
--          {waiterToken, ticket, info, ...}}
local limit = get_limit()
purge_waiters()
grant(limit, purge_holders())
local holders = {}
local h = redis.call('ZRANGE', K_HOLDERS, 0, -1, 'WITHSCORES')
for i = 1, #h, 2 do
  holders[#holders + 1] = h[i]
  holders[#holders + 1] = h[i + 1]
  holders[#holders + 1] = redis.call('HGET', K_INFO, h[i]) or ''
end
local waiters = {}
local q = redis.call('ZRANGE', K_QUEUE, 0, -1, 'WITHSCORES')
for i = 1, #q, 2 do
  waiters[#waiters + 1] = q[i]
  waiters[#waiters + 1] = q[i + 1]
  waiters[#waiters + 1] = redis.call('HGET', K_INFO, q[i]) or ''
end
return {limit, now, holders, waiters}
