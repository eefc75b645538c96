-- adapt is the controller's call. In auto mode it sets the limit to N
-- clamped into [min, max], holding for a while: once that has passed
-- without another adapt, get_limit (lib.lua) falls back to the fixed N.
-- Raising the limit grants waiters at once; lowering it lets holders
-- finish and grants nobody until the held weight fits, and fails no queued
-- request (none weighs more than max: setauto.lua, acquire.lua). In shadow
-- mode it records N and the reason and leaves the limit alone.
--   ARGV[5] N: a whole number from 1 to MAX_LIMIT
--   ARGV[6] how long (ms) N holds
--   ARGV[7] the controller's reason
--   ARGV[8] the controller's lease as control.lua gave it: the call is
--           refused unless it is still the controller's
--   ARGV[9] what the controller read in its window (JSON), kept for Stats
--           with the time it came
-- Returns {previous limit, limit, N as clamped}; an error reply naming
-- the fix when the semaphore is in neither mode or the caller is not the
-- controller.
local mode, lo, hi, fixed, till, _, moved, why = s_match(found_auto or '', AUTO_PATTERN)
if not mode then
  error(redis.error_reply('ERR not in auto mode: the limit is fixed; put the semaphore in auto mode first (SetAuto, or scheduler permits auto)'))
end
if rcall('GET', K_CTL) ~= ARGV[8] then
  error(redis.error_reply('ERR not the controller: its lease ran out or another took over'))
end
local n = checked_limit(ARGV[5])
local hold = to_number(ARGV[6])
local old = get_limit()
mode, lo, hi, fixed, till, _, moved, why = s_match(found_auto, AUTO_PATTERN)
local nlo, nhi = to_number(lo), to_number(hi)
if n < nlo then n = nlo elseif n > nhi then n = nhi end
local reason = ARGV[7]
read_clock()
rcall('HSET', K_SIG, 'last', ARGV[9] or '', 'at', now_s)
if mode == 'shadow' then
  found_auto = auto_record(mode, lo, hi, fixed, till, int(n), moved, why, reason)
  rcall('SET', K_AUTO, found_auto)
  return {old, old, n}
end
if n ~= old or why ~= 'controller' then
  moved, why = now_s, 'controller'
end
rcall('SET', K_LIMIT, int(n))
found_auto = auto_record(mode, lo, hi, fixed, int(now + hold), int(n), moved, why, reason)
rcall('SET', K_AUTO, found_auto)
purge_waiters()
grant(n, purge_holders())
return {old, n, n}
