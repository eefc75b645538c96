-- unlist takes runs that have ended, or whose record is gone, out of the
-- job's index of unfinished runs. finish.lua takes out the runs it ends;
-- this catches any left listed, and those whose record was evicted or
-- deleted. It checks each run again here, so that a run
-- Retry resumed since the caller read it stays listed.
-- KEYS[1] unfinished ZSET  the job's runs that have not ended (start.lua)
-- ARGV[1] the prefix of the job's run records: a run's record is
--         ARGV[1] .. run ID
-- ARGV[2..] run IDs
-- Returns how many runs it took out.
local n = 0
for i = 2, #ARGV do
  local st = redis.call('HGET', ARGV[1] .. ARGV[i], 'state')
  if not st or st == 'succeeded' or st == 'failed' or st == 'cancelled' then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return n
