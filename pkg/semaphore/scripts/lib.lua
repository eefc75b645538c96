-- lib.lua is prepended to every semaphore script, so that all of them share
-- one key layout, one clock and one purge/grant routine.
--
-- KEYS (identical for every script; all share the {name} hash tag):
--   KEYS[1] limit    STRING  the fleet-wide limit
--   KEYS[2] holders  ZSET    token -> lease deadline (ms, Redis server time)
--   KEYS[3] queue    ZSET    token -> ticket (FIFO order)
--   KEYS[4] alive    ZSET    waiter token -> heartbeat deadline (ms),
--                            tombstone -> when it goes (bury)
--   KEYS[5] info     HASH    holder token -> "fence:grantedAtMs",
--                            waiter token -> "enqueuedAtMs",
--                            tombstone -> "gone" (bury)
--   KEYS[6] fence    STRING  INCR counter: one fence per grant
--   KEYS[7] ticket   STRING  INCR counter: one ticket per enqueue
--   KEYS[8] held     STRING  "fence:count:weight": the holders' total weight,
--                            valid while the fence counter and the number of
--                            holders are still those it names (see read_held)
--   KEYS[9] auto     STRING  the auto mode (see AUTO_PATTERN); absent: the
--                            limit is fixed, set by the operator alone
--   KEYS[10] signals HASH    for the controller (auto and shadow mode):
--                            counters of what releases reported (see
--                            report), "epoch", its election counter, and
--                            "ended", set when the operator ended auto mode
--   KEYS[11] control STRING  the controller's lease: "epoch:candidate",
--                            expiring (see control.lua)
-- ARGV (identical first three for every script):
--   ARGV[1] wake-list key prefix; a process's list is ARGV[1] .. processID
--   ARGV[2] the client's configured limit, written only when KEYS[1] is absent
--   ARGV[3] TTL (ms) of a wake list, so a dead process's list disappears
--   ARGV[4] the calling process's ID, or "": grants to the caller's own
--           waiters are not pushed to its wake list but collected in
--           LOCAL_GRANTS for the script to return, so that the caller hands
--           them over in-process, without a wake-up round trip
-- Script-specific ARGV start at ARGV[5].
--
-- A token is "<processID>:<sequence>:<weight>": the weight and the owning
-- process travel inside it, so granting needs no extra lookup.

-- Redis's Lua built-ins, looked up once. Each lookup of a global costs
-- Redis about as much as the string operation it fetches (a function
-- library's globals are guarded), and a function library cannot reach them
-- while it loads, only when its functions run: bind fills these on the
-- first call. (The library's Lua state persists between calls; an EVALSHA
-- script fills them on each.)
local rcall, s_byte, s_format, s_match, s_sub, to_number, m_floor

-- The state of one call, set by bind, read_clock and read_held. In a
-- function library these outlive the call, so bind must reset every one of
-- them.
local K_LIMIT, K_HOLDERS, K_QUEUE, K_ALIVE, K_INFO, K_FENCE, K_TICKET, K_HELD, K_AUTO, K_SIG, K_CTL
local WAKE_PREFIX, DEFAULT_LIMIT, WAKE_TTL, SELF -- DEFAULT_LIMIT: a string
local LOCAL_GRANTS -- token, fence, token, fence, ...
local now -- Redis server time (ms), once read_clock has read it
local now_s -- the same, as a string: see int
local waiters_purged -- purge_waiters ran in this call
-- The holders as read_held (and begin) found them and as this call changed
-- them: their number, total weight, and the fence counter ("0" if absent),
-- a string. held_changed: this call added or removed a holder, so finish
-- records them. held_tail: "count:weight" as the trusted record wrote them,
-- while they still hold (finish writes it back instead of formatting both).
local held_count, held_weight, held_fence, held_changed, held_tail
-- The limit, fence counter, record and auto mode as the call found them
-- (false if absent), read together by read_held: one call instead of four.
local found_limit, found_fence, found_record, found_auto
-- bound: in auto mode, the weight above which a request can never be
-- granted (the mode's max), once heavy_bound or get_limit has read it.
local bound
-- handed: release's reply if handoff passed the token on (see handoff).
local handed

-- int formats a number as an integer: Lua's default formatting switches to
-- exponent notation above 1e14. Every number passed to redis.call goes
-- through it (or is a string already): Redis 7.0 formats a Lua number
-- argument with printf's "%.17g", which costs more than the command it is
-- passed to.
local function int(n)
  return s_format('%d', n)
end

-- bind names the call's keys and arguments and resets its state. It makes
-- no Redis call: every script runs it first, then its short step if it has
-- one (handoff, queue_short), then begin.
local function bind(keys, argv)
  if not rcall then
    rcall, s_byte, s_format, s_match, s_sub = redis.call, string.byte, string.format, string.match, string.sub
    to_number, m_floor = tonumber, math.floor
  end
  K_LIMIT, K_HOLDERS, K_QUEUE, K_ALIVE = keys[1], keys[2], keys[3], keys[4]
  K_INFO, K_FENCE, K_TICKET, K_HELD, K_AUTO = keys[5], keys[6], keys[7], keys[8], keys[9]
  K_SIG, K_CTL = keys[10], keys[11]
  WAKE_PREFIX, DEFAULT_LIMIT, WAKE_TTL, SELF = argv[1], argv[2], argv[3], argv[4]
  LOCAL_GRANTS = {}
  waiters_purged = false
  held_count, held_weight, held_fence, held_changed, held_tail = nil, nil, nil, false, nil
  found_limit, found_fence, found_record, found_auto, bound = nil, nil, nil, nil, nil
  now, now_s, handed = nil, nil, false
end

-- read_clock reads Redis server time, never the client's: clock skew
-- between hosts cannot steal or expire permits. Functions and Redis >= 5
-- scripts replicate effects, so reading TIME before writing is allowed.
local function read_clock()
  if now then return end
  local t = rcall('TIME')
  now = to_number(t[1]) * 1000 + m_floor(to_number(t[2]) / 1000)
  now_s = int(now)
end

local function weight_of(tok)
  -- Most tokens end in ":1": skip the pattern match for them.
  local colon, one = s_byte(tok, -2, -1)
  if colon == 58 and one == 49 then return 1 end
  return to_number(s_match(tok, ':(%d+)$'))
end

local function process_of(tok)
  return s_match(tok, '^([^:]+):')
end

-- fence_in reads the fence in a holder's info entry (an HGET's reply).
local function fence_in(info)
  if not info then return 0 end
  return to_number(s_match(info, '^(%d+):')) or 0
end

local function fence_of(tok)
  return fence_in(rcall('HGET', K_INFO, tok))
end

-- MAX_LIMIT is the largest limit a semaphore takes: semaphore.MaxLimit in
-- Go. Sums of weights under it stay exact in Lua's numbers and in the
-- integers of a reply.
local MAX_LIMIT = 1048576

-- checked_limit returns the limit s names as a number, or raises an error
-- naming the ceiling when s is not a whole number from 1 to MAX_LIMIT.
local function checked_limit(s)
  local n = to_number(s)
  if not n or n < 1 or n > MAX_LIMIT or n ~= m_floor(n) then
    error(redis.error_reply('ERR the limit ' .. tostring(s) ..
      ' is out of range: a semaphore limit is a whole number from 1 to ' .. int(MAX_LIMIT)))
  end
  return n
end

-- The auto mode, KEYS[9]: "mode:min:max:fixed:until:cn:moved:why:reason".
-- mode is "auto" (a controller sets the limit within [min, max]) or
-- "shadow" (the controller's N is recorded, never applied); fixed is the
-- operator's N, the limit whenever no controller's N holds; until (ms,
-- Redis time) is when the controller's N stops holding, "0" while the
-- limit is fixed's; cn is the controller's last N ("0": none yet); moved
-- (ms) is when the limit last moved, and why: "operator" (SetAuto),
-- "controller" or "fallback" (the controller's N ran out); reason is the
-- controller's last word. In either mode the limit stays within [min, max].
local AUTO_PATTERN = '^(%a+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%a+):(.*)$'

-- auto_record formats the auto mode (every argument a string).
local function auto_record(mode, lo, hi, fixed, till, cn, moved, why, reason)
  return mode .. ':' .. lo .. ':' .. hi .. ':' .. fixed .. ':' .. till .. ':' .. cn .. ':' .. moved .. ':' .. why .. ':' .. reason
end

-- auto_due reports whether the controller's N has stopped holding, so that
-- the limit must fall back to the fixed N (read_held first; it reads the
-- clock only in auto mode while a controller's N holds).
local function auto_due()
  if not found_auto then return false end
  local till = s_match(found_auto, '^auto:%d+:%d+:%d+:(%d+):')
  if not till or till == '0' then return false end
  read_clock()
  return now >= to_number(till)
end

-- heavy_bound returns the weight above which a request can never be
-- granted: the limit, or in auto mode the max, which the controller may
-- raise the limit to (a cut never fails a request that fits under max).
local function heavy_bound(limit)
  if bound then return bound end
  if found_auto then
    local hi = s_match(found_auto, '^auto:%d+:(%d+):')
    if hi then
      bound = to_number(hi)
      return bound
    end
  end
  return limit
end

-- report adds what a released permit's holder said of its work to the
-- signals, in auto or shadow mode only (read_held first): sig is
-- "ms:outcome", the time (ms) from its grant to its release and how it
-- ended: o ok, x overload (a timeout), e another error, - unknown (only
-- its time counts). Call it once the permit is removed: over maxmemory an
-- EVALSHA script may write only after a removal.
local function report(sig)
  if not found_auto or not sig then return end
  local ms, o = s_match(sig, '^(%d+):(.)$')
  if not ms then return end
  rcall('HINCRBY', K_SIG, 'busy', ms)
  if o == 'o' then
    rcall('HINCRBY', K_SIG, 'n', 1)
    rcall('HINCRBY', K_SIG, 'okms', ms)
  elseif o == 'x' then
    rcall('HINCRBY', K_SIG, 'over', 1)
  elseif o == 'e' then
    rcall('HINCRBY', K_SIG, 'err', 1)
  end
end

-- fall_back sets the limit to the fixed N, recording why, and returns it.
local function fall_back(mode, lo, hi, fixed, cn, reason)
  read_clock()
  -- Over maxmemory an EVALSHA script may write only after a removal; this
  -- one removes a member no token can be.
  rcall('ZREM', K_HOLDERS, '')
  rcall('SET', K_LIMIT, fixed)
  found_limit = fixed
  found_auto = auto_record(mode, lo, hi, fixed, '0', cn, now_s, 'fallback', reason)
  rcall('SET', K_AUTO, found_auto)
  return to_number(fixed)
end

-- get_limit returns the limit, writing the client's configured one if Redis
-- has none (the fixed N in auto mode). In auto mode, once the controller's
-- N has stopped holding (Redis time), it writes the fixed N first.
-- (Read by read_held: call it before anything sets the limit.)
local function get_limit()
  local mode, lo, hi, fixed, till, cn, reason
  if found_auto then
    local _
    mode, lo, hi, fixed, till, cn, _, _, reason = s_match(found_auto, AUTO_PATTERN)
    if mode == 'auto' then
      bound = to_number(hi)
      if till ~= '0' then
        read_clock()
        if now >= to_number(till) then return fall_back(mode, lo, hi, fixed, cn, reason) end
      end
    end
  end
  if found_limit then return to_number(found_limit) end
  -- MGET reads a key of another type as absent; GET fails on it with
  -- WRONGTYPE, as it must: that is someone else's data, not ours to replace.
  local l = rcall('GET', K_LIMIT)
  if l then return to_number(l) end
  if mode then return fall_back(mode, lo, hi, fixed, cn, reason) end
  local limit = checked_limit(DEFAULT_LIMIT)
  rcall('SET', K_LIMIT, int(limit))
  return limit
end

-- wake tells the owning process about a token: "<token> <fence>" for a grant,
-- "<token> !" for a request that can never be granted under the limit.
local function wake(tok, msg)
  local key = WAKE_PREFIX .. process_of(tok)
  if type(msg) == 'number' then msg = int(msg) end
  -- The TTL is set when a push creates the list: a live process drains its
  -- list at once, so only a dead (or cut-off) process's list outlives it.
  if rcall('RPUSH', key, tok .. ' ' .. msg) == 1 then
    rcall('PEXPIRE', key, WAKE_TTL)
  end
end

-- reject_heavy fails every queued request heavier than limit, wherever it
-- stands in the queue: it could never be granted.
local function reject_heavy(limit)
  for _, tok in ipairs(rcall('ZRANGE', K_QUEUE, '0', '-1')) do
    if weight_of(tok) > limit then
      rcall('ZREM', K_QUEUE, tok)
      rcall('ZREM', K_ALIVE, tok)
      rcall('HDEL', K_INFO, tok)
      wake(tok, '!')
    end
  end
end

local function drop_waiter(tok)
  rcall('ZREM', K_QUEUE, tok)
  rcall('ZREM', K_ALIVE, tok)
  rcall('HDEL', K_INFO, tok)
end

-- GONE is the info entry of a token its process gave back while Redis knew
-- nothing of it (bury).
local GONE = 'gone'

-- purge_waiters removes waiters whose heartbeat stopped: a crashed process
-- gives its places in the queue back. Once per call is enough. grant calls
-- it only when the queue head is dead; the watchdog's refresh and stats call
-- it every time, so a dead waiter further back goes within Lease/3.
local function purge_waiters()
  if waiters_purged then return end
  waiters_purged = true
  for _, tok in ipairs(rcall('ZRANGEBYSCORE', K_ALIVE, '-inf', now_s)) do
    drop_waiter(tok)
  end
end

-- bury leaves a tombstone for tok, which its process gave back while Redis
-- knew nothing of it: the acquire call that sent tok may still be on its
-- way, its reply lost (a network that drops packets delivers it when it
-- heals, after the client has asked again under a new token). That call
-- finds the tombstone and takes nothing (acquire.lua, queue_tokens), where
-- it used to take a place or a permit that nobody would use or refresh,
-- taken for a lease and more. The tombstone goes ms from now with the dead
-- waiters (purge_waiters: drop_waiter removes it).
local function bury(tok, ms)
  read_clock()
  purge_waiters() -- and expired tombstones: an idle semaphore keeps none
  rcall('HSET', K_INFO, tok, GONE)
  rcall('ZADD', K_ALIVE, int(now + ms), tok)
end

-- The holders' number and total weight. Summing the weight
-- means reading every holder (ZRANGE 0 -1: with a limit of 64, the most
-- expensive step of a call by far), so the last call that changed the
-- holders recorded the sum in KEYS[8] with the fence counter and the number
-- of holders it left. The record is trusted only while both still match:
-- every grant, by any version of these scripts, increments the fence
-- counter, and every removal changes the number of holders, so a holder
-- added or removed by anything else — an operator, an eviction — makes it
-- stale, and the sum is read afresh.
--
-- read_held reads the limit, the fence counter, the record and the auto
-- mode (one MGET)
-- and the number of holders, once per call, and takes the weight from the
-- record if it can be trusted; otherwise held_weight stays nil, and begin
-- sums it. Call it before the call changes anything.
local function read_held()
  if held_count then return end
  local got = rcall('MGET', K_LIMIT, K_FENCE, K_HELD, K_AUTO)
  found_limit, found_fence, found_record, found_auto = got[1], got[2], got[3], got[4]
  held_count = rcall('ZCARD', K_HOLDERS)
  held_fence = found_fence or '0'
  local rec = found_record
  if rec then
    local f, tail, n, w = s_match(rec, '^(%d+):((%d+):(%d+))$')
    if f == held_fence and to_number(n) == held_count then
      held_weight, held_tail = to_number(w), tail
    end
  end
end

-- begin reads what every whole script needs: the clock, and the holders'
-- number and weight, summing the weight afresh if the record is stale. A
-- short step may have read some of it already in this call.
local function begin()
  read_clock()
  read_held()
  if held_weight then return end
  held_weight = 0
  for _, tok in ipairs(rcall('ZRANGE', K_HOLDERS, '0', '-1')) do
    held_weight = held_weight + weight_of(tok)
  end
end

-- holder_added and holder_removed keep read_held's view current; every
-- change to K_HOLDERS's members goes through one of them.
-- holder_added's fence is the new fence counter, formatted (int).
local function holder_added(tok, fence)
  held_count = held_count + 1
  held_weight = held_weight + weight_of(tok)
  held_fence, held_changed, held_tail = fence, true, nil
end

local function holder_removed(tok)
  held_count = held_count - 1
  held_weight = held_weight - weight_of(tok)
  held_changed, held_tail = true, nil
end

-- finish records the holders for the next call's read_held, if this call
-- changed them; it passes the script's reply through. (A call that changed
-- nothing writes nothing: its first write must stay a removal where
-- maxmemory allows only those.)
local function finish(reply)
  if held_changed then
    rcall('SET', K_HELD, held_fence .. ':' .. (held_tail or (int(held_count) .. ':' .. int(held_weight))))
  end
  return reply
end

-- LOST marks the info entry of a holder kept past its lease (see
-- purge_holders): "fence:grantedAtMs" .. LOST.
local LOST = ':lost'

local function is_lost(info) -- info: an HGET's reply, false if absent
  return type(info) == 'string' and s_sub(info, -#LOST) == LOST
end

-- purge_holders removes holders whose lease ran out (a crashed process gives
-- its permits back) and returns the weight the others hold: every script
-- needs both.
--
-- Except, when owner is given (the process making this call, which is
-- therefore alive), that process's own expired holders: each is kept once,
-- for keep_ms more, and marked lost. Their process has cancelled the work
-- they guard and releases each once that work has stopped (a query gone
-- from the database); until then its permit must not go to a waiter, as it
-- would if this call (the release of another of them, say) purged it.
-- Kept once, so a permit its process never releases still returns within
-- keep_ms; and a process that does not call at all is not kept, so a dead
-- holder returns as it always did.
local function purge_holders(owner, keep_ms)
  local marked = false
  for _, tok in ipairs(rcall('ZRANGEBYSCORE', K_HOLDERS, '-inf', now_s)) do
    local info = owner and process_of(tok) == owner and rcall('HGET', K_INFO, tok)
    if info and not is_lost(info) then
      if not marked then
        -- Over maxmemory an EVALSHA script may write only after a
        -- removal; this one removes a member no token can be.
        rcall('ZREM', K_HOLDERS, '')
        marked = true
      end
      rcall('ZADD', K_HOLDERS, 'XX', int(now + keep_ms), tok)
      rcall('HSET', K_INFO, tok, info .. LOST)
    else
      if rcall('ZREM', K_HOLDERS, tok) == 1 then
        holder_removed(tok)
      end
      rcall('HDEL', K_INFO, tok)
    end
  end
  return held_weight
end

-- add_holder makes tok a holder until deadline, a string (as ZSCORE
-- returns a waiter's heartbeat deadline), and returns its fence.
local function add_holder(tok, deadline)
  local fence = rcall('INCR', K_FENCE)
  local fence_s = int(fence)
  if rcall('ZADD', K_HOLDERS, deadline, tok) == 1 then
    holder_added(tok, fence_s)
  else
    held_fence = fence_s
  end
  rcall('HSET', K_INFO, tok, fence_s .. ':' .. now_s)
  return fence
end

-- grant_head makes the queue's head, alive until deadline (a string, as
-- ZSCORE returned it), a holder, and
-- tells its process (or collects the grant in LOCAL_GRANTS for the caller).
-- A granted waiter's first lease ends at its heartbeat deadline, so a
-- waiter that died just before its grant blocks nobody past that deadline;
-- a live one's watchdog extends it.
local function grant_head(head, deadline)
  -- add_holder overwrites the waiter's info entry: no HDEL needed.
  rcall('ZREM', K_QUEUE, head)
  rcall('ZREM', K_ALIVE, head)
  local fence = add_holder(head, deadline)
  if process_of(head) == SELF then
    LOCAL_GRANTS[#LOCAL_GRANTS + 1] = head
    LOCAL_GRANTS[#LOCAL_GRANTS + 1] = fence
  else
    wake(head, fence)
  end
end

-- grant hands free capacity to the queue head(s) in ticket order and wakes
-- their processes. The head is never overtaken: when it does not fit, nobody
-- behind it is granted (FIFO for weighted requests).
-- Every weight is at least 1, so a full semaphore grants nothing and costs no
-- call: the common case under contention. A dead head (heartbeat lapsed, or
-- missing: evicted or edited by hand) makes it purge every dead waiter.
-- Takes and returns the held weight; also returns whether the queue is
-- known to be empty.
local function grant(limit, held)
  while held < limit do
    local head = rcall('ZRANGE', K_QUEUE, '0', '0')[1]
    if not head then return held, true end
    local deadline_s = rcall('ZSCORE', K_ALIVE, head)
    local deadline = to_number(deadline_s)
    local w = weight_of(head)
    if not deadline or deadline <= now then
      if not deadline then drop_waiter(head) end
      waiters_purged = false
      purge_waiters()
    elseif w > heavy_bound(limit) then
      drop_waiter(head)
      wake(head, '!')
    elseif held + w <= limit then
      grant_head(head, deadline_s)
      held = held + w
    else
      return held, false
    end
  end
  return held, false
end

-- queue_tokens queues tokens (first calls: fresh ones, never sent before)
-- at the queue's tail, in order, each as acquire.lua would queue it, with a
-- heartbeat deadline heartbeat ms from now; it returns their tickets, -1
-- for one heavier than limit (never grantable, not queued), 0 for one Redis
-- knows already (a tombstone: its process gave it up before this call
-- landed; see bury), which it leaves as it is.
local function queue_tokens(tokens, heartbeat, limit)
  local tickets = {}
  local n = #tokens
  if n == 0 then return tickets end
  read_clock()
  local hb = int(now + to_number(heartbeat))
  if n == 1 then
    -- The common case, at no cost: the heartbeat it writes anyway, with
    -- NX, tells whether there was one (a tombstone has one: bury).
    local t = tokens[1]
    if weight_of(t) > limit then
      tickets[1] = -1
    elseif rcall('ZADD', K_ALIVE, 'NX', hb, t) == 0 then
      tickets[1] = 0
    else
      tickets[1] = rcall('INCR', K_TICKET)
      rcall('ZADD', K_QUEUE, int(tickets[1]), t)
      rcall('HSET', K_INFO, t, now_s)
    end
    return tickets
  end
  local known = rcall('HMGET', K_INFO, unpack(tokens))
  local fresh = 0
  for k = 1, n do
    if known[k] then
      tickets[k] = 0
    elseif weight_of(tokens[k]) > limit then
      tickets[k] = -1
    else
      fresh = fresh + 1
    end
  end
  if fresh == 0 then return tickets end
  local first = rcall('INCRBY', K_TICKET, fresh) - fresh
  local q, a, i = {}, {}, {}
  for k = 1, n do
    local t = tokens[k]
    if not tickets[k] then
      first = first + 1
      tickets[k] = first
      q[#q + 1] = int(first); q[#q + 1] = t
      a[#a + 1] = hb; a[#a + 1] = t
      i[#i + 1] = t; i[#i + 1] = now_s
    end
  end
  rcall('ZADD', K_QUEUE, unpack(q))
  rcall('ZADD', K_ALIVE, unpack(a))
  rcall('HSET', K_INFO, unpack(i))
  return tickets
end

-- The short steps below run between bind and begin, where a script has
-- one. They read only what they need (read_held: one MGET and a ZCARD),
-- and what they read begin does not read again.

-- queue_short is acquire's short step: a first call that asks to wait
-- (ARGV[8] == "1", ARGV[9] ~= "1") while the held weight fills the limit
-- cannot be granted now, whoever else waits, so it only takes the next
-- place at the tail: no purge, no grant (an expired holder's permit is
-- purged by the next whole script; every watchdog refresh is one, so S3's
-- bound holds). The record is trusted only as begin trusts it. Returns
-- acquire's reply, or nil.
local function queue_short(argv)
  if argv[8] ~= '1' or argv[9] == '1' then return nil end
  read_held()
  local limit = to_number(found_limit)
  if not limit or not held_weight or held_weight < limit or weight_of(argv[5]) > limit then return nil end
  if auto_due() then return nil end -- the whole script falls back first
  local ticket = queue_tokens({argv[5]}, argv[7], limit)[1]
  if ticket == 0 then return {3, 0, limit} end -- a tombstone: see acquire.lua
  return {0, ticket, limit}
end

-- handoff is release's short step: the common hand-off under contention,
-- in about half the work of the whole release. When the caller vouches for
-- its permit (ARGV[8] == "1": its lease has a safe margin, so Redis cannot
-- have let it lapse or marked it lost), the held record is current and
-- within the limit, and the queue's head is alive and weighs what the
-- permit does, the permit goes to the head as grant gives it (grant_head).
-- The swap changes neither the number of holders nor their weight; finish
-- records the new fence. What it skips: the purge (a swap needs no free
-- capacity; an expired holder is purged by the next whole script, and
-- every watchdog refresh is one, within S3's bound), summing the holders,
-- and the grant loop. A limit lowered below the held weight takes no
-- hand-off, as it takes no grant.
-- The waiters a release carries (ARGV[9..]) are queued here too when the
-- held weight fills the limit, so that none of them could be granted now;
-- otherwise the whole release queues them, having released nothing more
-- (release.lua). A call that releases nothing and only carries waiters
-- (token "") is queue_short's case for several waiters.
-- handed is release's reply if the permit was passed on or the carried
-- waiters queued (without their tickets and grants when the whole release
-- is to queue them); handoff returns whether that reply is complete.
local function handoff(argv)
  local tok = argv[5]
  local carried = argv[10] and {unpack(argv, 10)}
  if argv[8] ~= '1' and not (tok == '' and carried) then return false end
  read_held()
  local limit = to_number(found_limit)
  if not limit or not held_weight or auto_due() then return false end
  if tok ~= '' then
    if held_weight > limit then return false end
    local head = rcall('ZRANGE', K_QUEUE, '0', '0')[1]
    if not head or weight_of(head) ~= weight_of(tok) then return false end
    read_clock()
    -- A dead head is for the whole release to purge.
    local deadline = rcall('ZSCORE', K_ALIVE, head)
    if not deadline or to_number(deadline) <= now then return false end
    if rcall('ZREM', K_HOLDERS, tok) == 0 then return false end
    -- The swap leaves the holders' number and weight as the record says
    -- (if the head was not somehow a holder already).
    local tail, count = held_tail, held_count
    holder_removed(tok)
    rcall('HDEL', K_INFO, tok)
    report(argv[9])
    grant_head(head, deadline)
    if held_count == count then held_tail = tail end
    handed = {3, limit, 0}
  elseif held_weight >= limit then
    handed = {0, limit, 0}
  else
    return false
  end
  if carried then
    if held_weight < limit then return false end
    local tickets = queue_tokens(carried, argv[7], heavy_bound(limit))
    handed[3] = #tickets
    for k = 1, #tickets do handed[3 + k] = tickets[k] end
  end
  for _, v in ipairs(LOCAL_GRANTS) do handed[#handed + 1] = v end
  return true
end
