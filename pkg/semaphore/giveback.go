package semaphore

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
)

// releaseToken gives back whatever token holds or waits for in Redis, and
// hands the capacity it frees to this process's own waiters directly when
// they are next in line: no wake-up round trip for a local hand-off. Should
// the reply be lost, the watchdog finds those grants at its next refresh
// (at once if the loss was a Redis outage: see noteCall).
//
// This process's other permits whose leases ran out in Redis, if Redis
// still has them, are kept for up to one more Lease (once), rather than
// purged: it has cancelled their work and releases each once that work
// has stopped, so their capacity must not go to a waiter before (see
// purge_holders in scripts/lib.lua).
//
// With carry, it also carries this process's pending waiters (enqueue.go).
// With handoff, the caller vouches that token holds a permit whose lease
// has a safe margin: Redis may then pass it straight to the queue's head,
// without the rest of the release (handoff in scripts/lib.lua).
func (s *Semaphore) releaseToken(ctx context.Context, token string, carry, handoff bool, report string) (int64, error) {
	ws, tokens := s.beginRelease(carry)
	defer s.endRelease(ws)
	return s.callRelease(ctx, token, ws, tokens, handoff, report)
}

// callRelease runs release.lua for token ("" releases nothing), carrying
// the waiters ws, whose tokens are tokens; handoff: see releaseToken;
// report: what the token's holder says of its work (Permit.Report).
func (s *Semaphore) callRelease(ctx context.Context, token string, ws []*waiter, tokens []string, handoff bool, report string) (int64, error) {
	lease := s.opts.Lease.Milliseconds()
	flag := "0"
	if handoff {
		flag = "1"
	}
	args := []any{token, lease, lease, flag, report}
	sc := scriptRelease
	if len(ws) > 0 {
		sc = scriptCarry
		for _, t := range tokens {
			args = append(args, t)
		}
	}
	// Grants to this process's waiters come back in the reply: where they
	// must wait for a replica, the WAIT rides in the same round trip.
	var ack *replicaAck
	cctx := ctx
	if s.hasWaiters() {
		cctx, ack = s.askReplica(ctx)
	}
	sent := time.Now()
	res, err := s.evalAs(cctx, s.process, sc, args...)
	if err != nil && len(ws) > 0 && isOOM(err) {
		// Redis is over its maxmemory and refused the call before it
		// recorded any of them (a function outright; by EVALSHA at its
		// first write that may grow memory, which comes before theirs):
		// the waiters ask on their own, as first calls (and hear why), and
		// the permit goes back alone, as releases may over maxmemory.
		s.settleCarried(ws, nil, 0, sent, err, false)
		if token == "" {
			return 0, nil // it carried, and released nothing
		}
		ws = nil
		res, err = s.evalAs(cctx, s.process, scriptRelease, token, lease, lease, "0", report)
	}
	if err != nil {
		s.settleCarried(ws, nil, 0, sent, err, true)
		return 0, err
	}
	vals, _ := res.([]any)
	var n int64
	if len(vals) >= 3 {
		n, _ = vals[2].(int64)
	}
	if len(vals) < 3 || n != int64(len(ws)) || int64(len(vals)) < 3+n || (int64(len(vals))-3-n)%2 != 0 {
		err := fmt.Errorf("unexpected reply %v from the release script", res)
		s.settleCarried(ws, nil, 0, sent, err, true)
		return 0, err
	}
	limit, _ := vals[1].(int64)
	tickets := make([]int64, n)
	for i := range tickets {
		tickets[i], _ = vals[3+i].(int64)
	}
	s.settleCarried(ws, tickets, limit, sent, nil, false)
	grants := vals[3+n:]
	for i := 0; i+1 < len(grants); i += 2 {
		tok, _ := grants[i].(string)
		fence, _ := grants[i+1].(int64)
		acked := ack.acked()
		if ack == nil {
			acked = s.unconfirmed() // a waiter that came meanwhile
		}
		s.deliver(tok, fence, time.Time{}, acked)
	}
	if len(grants) > 0 {
		// Let the new holder run now, on this thread, rather than after our
		// caller's next Redis call or once an idle thread wakes up.
		runtime.Gosched()
	}
	was, _ := vals[0].(int64)
	if was == releaseHanded {
		s.handoffs.Add(1)
		was = releaseHeld
	}
	return was, nil
}

// hasWaiters reports whether this process has waiters, whom a release
// may grant a permit in its reply.
func (s *Semaphore) hasWaiters() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiters) > 0
}

// giveBackResult is what the first attempt to give a token back found.
type giveBackResult struct {
	was      int64 // the release script's word: releaseHeld, releaseQueued or releaseUnknown
	err      error
	retrying bool // err may pass: the give-back goes on in the background
}

// giveBack gives token back in a goroutine that Close waits for, and
// returns a channel that receives the first attempt's result. An attempt
// that fails for a reason that may pass (Redis unreachable, restarting,
// failing over) is retried with backoff until Redis answers, or, once the
// Semaphore is closed, after one last attempt. Without the retries a
// permit released during a Redis restart would block its capacity for a
// whole lease after Redis is back.
//
// The retries go on past the token's lease or heartbeat: Redis does not drop a lapsed permit by itself when this
// process calls first, it keeps it for one more Lease (purge_holders,
// scripts/lib.lua), because a live process's lapsed permit guards work
// that may still run. So after an outage longer than the lease, a release
// that had stopped at its deadline left a permit that nothing guarded
// taken for another Lease, and the fleet's throughput fell for that long.
// A late release hands the capacity it frees to this process's waiters as
// any release does.
//
// handoff: see releaseToken; for the first attempt only (a retry may follow
// a first attempt that ran).
func (s *Semaphore) giveBack(ctx context.Context, token string, handoff bool, report string) <-chan giveBackResult {
	first := make(chan giveBackResult, 1)
	s.spawn(func() { s.giveBackRetrying(context.WithoutCancel(ctx), token, first, handoff, report) })
	return first
}

// releaseDetached gives token back for a caller that has already moved on,
// retrying as giveBack does.
func (s *Semaphore) releaseDetached(token string) {
	s.giveBackRetrying(context.Background(), token, nil, false, "")
}

// giveBackRetrying is giveBack's loop; first, if not nil, receives the
// first attempt's result. report rides on every attempt: Redis counts it
// only with the permit it releases.
func (s *Semaphore) giveBackRetrying(ctx context.Context, token string, first chan<- giveBackResult, handoff bool, report string) {
	var bo backoff.Backoff
	detached := first == nil
	last := s.stopped() // Close's own give-backs make one attempt
	for attempt := 1; ; attempt++ {
		actx, cancel := bounded(ctx, releaseTimeout)
		was, err := s.releaseToken(actx, token, attempt == 1, handoff && attempt == 1, report)
		cancel()
		retry := err != nil && mayPass(err) && !last
		if first != nil {
			first <- giveBackResult{was: was, err: err, retrying: retry}
		}
		if !retry {
			s.logGiveBack(token, attempt, was, err, detached, last)
			return
		}
		if attempt == 1 {
			level := slog.LevelWarn
			if transient(err) {
				level = slog.LevelDebug // the handle's outage log warned of the outage once
			}
			s.log.Log(context.Background(), level, "semaphore: giving a permit back failed; retrying in the background until Redis answers",
				"permit", token, "error", err)
		}
		first = nil
		if s.stopped() {
			last = true // one last attempt, now
			continue
		}
		if perr := s.pause(ctx, bo.Next()); perr != nil {
			last = true
			continue
		}
	}
}

// logGiveBack says how a give-back ended, where no caller hears of it: a
// detached one, or one that needed more than one attempt.
func (s *Semaphore) logGiveBack(token string, attempts int, was int64, err error, detached, closing bool) {
	switch {
	case err != nil && (detached || attempts > 1):
		msg := "semaphore: could not give a permit back; it returns when its lease runs out"
		if closing {
			msg = "semaphore: could not give a permit back before Close; it returns when its lease runs out"
		}
		s.log.Warn(msg, "permit", token, "attempts", attempts, "error", err)
	case err == nil && attempts > 1:
		// At debug: the outage's end is one info line of the handle's.
		s.log.Debug("semaphore: gave a permit back once Redis answered again", "permit", token, "attempts", attempts, "was_held", was == releaseHeld)
	}
}
