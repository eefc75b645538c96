-- setlimit changes the fleet-wide limit and, when it rose, hands the new
-- capacity to waiters at once. Holders above a lowered limit keep their
-- permits until they release; nobody new is granted until the sum fits.
-- Queued requests heavier than the new limit fail at once.
--   ARGV[5] new limit (>= 1)
-- Returns the previous limit.
local old = get_limit()
rcall('SET', K_LIMIT, ARGV[5])
purge_waiters()
reject_heavy(to_number(ARGV[5]))
grant(to_number(ARGV[5]), purge_holders())
return old
