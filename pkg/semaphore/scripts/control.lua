-- control is a controller candidate's call, once a window: it takes the
-- controller's lease when nobody holds it, renews it when the caller does,
-- and reads the signals. A new holder gets a new epoch, so that a former
-- holder's adapt (its lease value) is refused.
--   ARGV[5] the candidate's ID
--   ARGV[6] the lease (ms)
-- Returns {lease value "epoch:candidate" of the holder, lead (1 or 0),
--          n, okms, busy, err, over, ended, auto, window}: the counters of
--          the signals hash (report, lib.lua), the auto mode's record and
--          the operator's window (ms, setauto.lua), "" where absent.
local me, ms = ARGV[5], ARGV[6]
local cur = rcall('GET', K_CTL)
local lead = 0
if not cur then
  cur = rcall('HINCRBY', K_SIG, 'epoch', 1) .. ':' .. me
  rcall('SET', K_CTL, cur, 'PX', ms)
  lead = 1
elseif s_match(cur, '^%d+:(.*)$') == me then
  rcall('PEXPIRE', K_CTL, ms)
  lead = 1
end
local out = {cur, lead}
local sig = rcall('HMGET', K_SIG, 'n', 'okms', 'busy', 'err', 'over', 'ended')
for i = 1, 6 do out[#out + 1] = sig[i] or '' end
out[#out + 1] = rcall('GET', K_AUTO) or ''
out[#out + 1] = rcall('HGET', K_SIG, 'window') or ''
return out
