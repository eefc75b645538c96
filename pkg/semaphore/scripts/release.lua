-- release gives a token's permit back, or takes a waiter out of the queue,
-- and hands the freed capacity to the queue head(s).
--   ARGV[5] token
--   ARGV[6] (ms) how long the caller's own holders whose lease ran out are
--           kept for it to release (see purge_holders); absent: not kept
--   ARGV[7] heartbeat timeout (ms) of the waiters in ARGV[9..]
--   ARGV[8] "1" if the caller vouches that the token's lease has a safe
--           margin, so that handoff (lib.lua, this script's short step) may
--           pass it straight to the queue's head
--   ARGV[9] what the token's holder reports of its work, "ms:outcome"
--           (report, lib.lua); "" for none
--   ARGV[10..] new waiters of the calling process to queue, in order: their
--           acquire calls, carried by this one (see enqueue.go). Each is a
--           fresh token, never sent before, and asks to wait.
-- Returns {was, limit, n, ticket_1 .. ticket_n, token, fence, token, fence, ...}:
-- was is 1 if the token held a permit, 3 if it held one and handoff passed
-- it to the queue's head, 2 if it was queued, 0 if Redis knew
-- nothing of it (already released, or its lease or heartbeat ran out: kept
-- for the caller or not; "" releases nothing), and then leaves a tombstone
-- for it (bury, lib.lua); n is the number of carried
-- waiters, and ticket_i the place ARGV[9+i] took, -1 if its weight
-- exceeds the limit, in auto mode the max (never grantable), or 0 if it found a tombstone
-- (not queued); then the grants made to the
-- caller's own waiters (ARGV[4]), carried ones among them, which it must
-- hand over itself.
local tok = ARGV[5]
local limit = get_limit()
-- Purge before looking: a token whose lease ran out was lost, not released.
-- The caller's other lost permits stay held until it releases them too.
local keep_ms = to_number(ARGV[6])
local owner = nil
if SELF ~= '' and keep_ms and keep_ms > 0 then owner = SELF end
local held = purge_holders(owner, keep_ms)
-- The carried waiters join the queue's tail first, each as acquire.lua
-- would queue it, so that the capacity this call frees reaches them too
-- if nobody is ahead of them.
local tickets = queue_tokens({unpack(ARGV, 10)}, ARGV[7], heavy_bound(limit))
local n = #tickets
local was = 0
if handed then
  -- handoff passed the permit on before this call began (lib.lua); a
  -- grant to our own head is in LOCAL_GRANTS already.
  was = 3
elseif rcall('ZREM', K_HOLDERS, tok) == 1 then
  was = 1
  if is_lost(rcall('HGET', K_INFO, tok)) then was = 0 end
  holder_removed(tok)
  rcall('HDEL', K_INFO, tok)
  held = held - weight_of(tok)
  if was == 1 then report(ARGV[9]) end
elseif rcall('ZSCORE', K_QUEUE, tok) then
  was = 2
  drop_waiter(tok)
elseif tok ~= '' then
  -- Given back before its acquire call landed, perhaps: that call must
  -- take nothing when it does (bury, lib.lua). For four leases, and at
  -- least five minutes: longer than TCP goes on resending a request.
  local ms = 4 * (keep_ms or 0)
  if ms < 300000 then ms = 300000 end
  bury(tok, ms)
end
grant(limit, held)
local out = {was, limit, n}
for k = 1, n do
  out[#out + 1] = tickets[k]
end
for _, v in ipairs(LOCAL_GRANTS) do
  out[#out + 1] = v
end
return out
