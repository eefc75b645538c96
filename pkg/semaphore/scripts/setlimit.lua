-- setlimit changes the fleet-wide limit and, when it rose, hands the new
-- capacity to waiters at once. Holders above a lowered limit keep their
-- permits until they release; nobody new is granted until the sum fits.
-- Queued requests heavier than the new limit fail at once. The limit is
-- fixed from then on: the auto mode, if any, ends.
--   ARGV[5] new limit: a whole number from 1 to MAX_LIMIT (lib.lua)
-- Returns the previous limit; an error reply naming the ceiling, changing
-- nothing, for a limit out of range.
local limit = checked_limit(ARGV[5])
local old = get_limit()
rcall('SET', K_LIMIT, int(limit))
if found_auto then
  -- A controller tells an operator's end of auto mode from lost keys.
  rcall('DEL', K_AUTO)
  rcall('HSET', K_SIG, 'ended', '1')
end
found_auto, bound = false, nil
purge_waiters()
reject_heavy(limit)
grant(limit, purge_holders())
return old
