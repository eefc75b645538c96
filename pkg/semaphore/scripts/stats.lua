-- stats returns a consistent snapshot, after purging the dead. It writes no
-- limit: looking at a semaphore nobody has used yet must not set its limit
-- to the looker's default (limit 0 in the reply means "none yet"). In auto
-- mode it applies a due fall-back to the fixed N (get_limit), as any call.
-- Returns {limit, now,
--          {holderToken, leaseDeadline, info, ...},
--          {waiterToken, ticket, info, ...},
--          auto mode record, "" in fixed mode (lib.lua, AUTO_PATTERN),
--          the controller's last signals (adapt.lua) and when (ms), and
--          the operator's window (ms, setauto.lua), "" in fixed mode}
-- (GET, not begin's MGET, when absent: a key of another type must fail.)
local limit = to_number(found_limit or rcall('GET', K_LIMIT) or '0')
if limit > 0 and found_auto then
  limit = get_limit()
end
purge_waiters()
if limit > 0 then
  grant(limit, purge_holders())
end
local holders = {}
local h = rcall('ZRANGE', K_HOLDERS, '0', '-1', 'WITHSCORES')
for i = 1, #h, 2 do
  holders[#holders + 1] = h[i]
  holders[#holders + 1] = h[i + 1]
  holders[#holders + 1] = rcall('HGET', K_INFO, h[i]) or ''
end
local waiters = {}
local q = rcall('ZRANGE', K_QUEUE, '0', '-1', 'WITHSCORES')
for i = 1, #q, 2 do
  waiters[#waiters + 1] = q[i]
  waiters[#waiters + 1] = q[i + 1]
  waiters[#waiters + 1] = rcall('HGET', K_INFO, q[i]) or ''
end
local signals, at, window = '', '', ''
if found_auto then
  local got = rcall('HMGET', K_SIG, 'last', 'at', 'window')
  signals, at, window = got[1] or '', got[2] or '', got[3] or ''
end
return {limit, now, holders, waiters, found_auto or '', signals, at, window}
