-- control is a controller candidate's call, once a window: it takes the
-- controller's lease when nobody holds it, renews it when the caller does,
-- and reads the signals. A new holder gets a new epoch, so that a former
-- holder's adapt (its lease value) is refused. In fixed mode there is
-- nothing to control and it writes nothing: nobody takes the lease, and
-- its holder gives it up, unless the candidate may restore an auto mode
-- that Redis lost (ARGV[7]).
--   ARGV[5] the candidate's ID
--   ARGV[6] the lease (ms)
--   ARGV[7] "1" if the candidate led in auto mode and remembers it
-- Returns {lease value "epoch:candidate" of the holder, lead (1 or 0),
--          n, okms, busy, err, over, ended, auto, window}: the counters of
--          the signals hash (report, lib.lua), the auto mode's record and
--          the operator's window (ms, setauto.lua), "" where absent.
local me, ms = ARGV[5], ARGV[6]
local auto = rcall('GET', K_AUTO)
local campaign = auto or ARGV[7] == '1'
local cur = rcall('GET', K_CTL)
local lead = 0
if not cur then
  if campaign then
    cur = rcall('HINCRBY', K_SIG, 'epoch', 1) .. ':' .. me
    rcall('SET', K_CTL, cur, 'PX', ms)
    lead = 1
  end
elseif s_match(cur, '^%d+:(.*)$') == me then
  if campaign then
    rcall('PEXPIRE', K_CTL, ms)
    lead = 1
  else
    rcall('DEL', K_CTL)
  end
end
local out = {cur or '', lead}
local sig = rcall('HMGET', K_SIG, 'n', 'okms', 'busy', 'err', 'over', 'ended', 'window')
for i = 1, 6 do out[#out + 1] = sig[i] or '' end
out[#out + 1] = auto or ''
out[#out + 1] = sig[7] or ''
return out
