-- setauto puts the semaphore in auto mode (ARGV[5] "auto": a controller
-- sets the limit within [min, max]) or shadow mode ("shadow": the
-- controller's N is recorded, never applied). The limit becomes the fixed
-- N clamped into [min, max], until a controller moves it (adapt.lua).
-- Queued requests that can never be granted fail at once: those heavier
-- than max in auto mode, than the limit in shadow mode.
--   ARGV[5] "auto" or "shadow"
--   ARGV[6] min, ARGV[7] max: whole numbers, 1 <= min <= max <= MAX_LIMIT
--   ARGV[8] the fixed N, or "0": the operator's N as it stands (the fixed
--           N of the auto mode in force, else the limit)
--   ARGV[9] the controller's window (ms), or "0": as it stands
-- Returns {previous limit, limit}; an error reply, changing nothing, for
-- bad input.
local mode = ARGV[5]
if mode ~= 'auto' and mode ~= 'shadow' then
  error(redis.error_reply('ERR unknown mode ' .. tostring(mode) .. ': use auto or shadow'))
end
local lo, hi = checked_limit(ARGV[6]), checked_limit(ARGV[7])
if hi < lo then
  error(redis.error_reply('ERR max ' .. int(hi) .. ' is below min ' .. int(lo) .. ': max must be at least min'))
end
local old = get_limit()
local fixed = to_number(ARGV[8])
if fixed == 0 then
  fixed = old
  local f = found_auto and s_match(found_auto, '^%a+:%d+:%d+:(%d+):')
  if f then fixed = to_number(f) end
else
  fixed = checked_limit(ARGV[8])
end
if fixed < lo then fixed = lo elseif fixed > hi then fixed = hi end
-- The controller's last N and reason stay on record.
local cn, reason = '0', ''
if found_auto then
  local c, r = s_match(found_auto, '^%a+:%d+:%d+:%d+:%d+:(%d+):%d+:%a+:(.*)$')
  if c then cn, reason = c, r end
end
read_clock()
rcall('SET', K_LIMIT, int(fixed))
found_auto = auto_record(mode, int(lo), int(hi), int(fixed), '0', cn, now_s, 'operator', reason)
rcall('SET', K_AUTO, found_auto)
rcall('HDEL', K_SIG, 'ended')
if ARGV[9] and ARGV[9] ~= '0' then rcall('HSET', K_SIG, 'window', ARGV[9]) end
bound = nil
purge_waiters()
reject_heavy(heavy_bound(fixed))
grant(fixed, purge_holders())
return {old, fixed}
