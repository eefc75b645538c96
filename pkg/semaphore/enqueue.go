package semaphore

import (
	"context"
	"fmt"
	"time"
)

// Carried enqueues: Nagle's algorithm for acquire calls.
//
// A waiter that arrives while another waiter of this process is still
// waiting cannot be granted before that one: whatever place it takes is
// behind it. If, besides, a release of this process is on its way to
// Redis, the new waiter's acquire call does not go alone. It waits in this
// process's pending list until that release has returned, and then goes
// with every other waiter that arrived meanwhile, in one call; or, sooner,
// with the next release this process starts, which queues it in the same
// script (release.lua), atomically, at the queue's tail. Under light load
// a process's calls seldom overlap and every acquire goes at once; under
// saturation they always do, and one call queues many waiters: Redis does
// a fraction of the work per grant.
//
// FIFO (S2) is unchanged: places are tickets, taken when a request
// reaches Redis, in the order requests arrive there; a carried request
// arrives about one release round trip after Acquire was called (at most
// maxPending), as it would over a slower network. Waiters of one process
// keep their order: they are carried oldest first. A new waiter is never held back when no
// other waiter of its process waits, so the delay never keeps a free
// permit from a process whose request could take it.

// maxCarried bounds the waiters one call carries.
const maxCarried = 64

// maxPending bounds how long a waiter waits for a carrier: a release call
// that hangs (a connection that went silent, until the redis client's
// ReadTimeout) must not hold back the waiters behind it.
const maxPending = 50 * time.Millisecond

// deferWaiter puts w, a new waiter about to make its first call, in the
// pending list if a release of this process is in flight and another of
// its waiters waits, and reports whether it did.
func (s *Semaphore) deferWaiter(w *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.releasing == 0 || len(s.waiters) < 2 || s.waiters[w.token] != w {
		return false
	}
	w.pending = true
	s.pending = append(s.pending, w)
	s.armPendingTimerLocked()
	return true
}

// armPendingTimerLocked starts maxPending's timer for the pending waiters,
// unless it runs already.
func (s *Semaphore) armPendingTimerLocked() {
	if s.pendingTimer == nil {
		s.pendingTimer = time.AfterFunc(maxPending, s.pendingTooLong)
	}
}

// pendingTooLong is maxPending's timer: the waiters still pending go now,
// in one call.
func (s *Semaphore) pendingTooLong() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pendingTimer = nil
	s.carryPendingLocked()
}

// carryPendingLocked sends the pending waiters in a call of their own: a
// release of no permit that carries them. It counts as in flight, so that
// those who arrive meanwhile wait for it in turn.
func (s *Semaphore) carryPendingLocked() {
	if len(s.pending) == 0 || s.closed {
		return
	}
	ws, tokens := s.beginReleaseLocked(true)
	if len(s.pending) > 0 { // more than one call's worth: the rest wait anew
		s.armPendingTimerLocked()
	}
	s.spawnLocked(func() {
		defer s.endRelease(ws)
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		_, _ = s.callRelease(ctx, "", ws, tokens, false, "")
	})
}

// beginRelease counts a release call in flight and, with carry, takes up
// to maxCarried pending waiters for it to carry, oldest first, with their
// tokens.
func (s *Semaphore) beginRelease(carry bool) ([]*waiter, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.beginReleaseLocked(carry)
}

func (s *Semaphore) beginReleaseLocked(carry bool) ([]*waiter, []string) {
	s.releasing++
	n := min(len(s.pending), maxCarried)
	if !carry || n == 0 {
		return nil, nil
	}
	ws := make([]*waiter, n)
	copy(ws, s.pending)
	s.pending = append(s.pending[:0], s.pending[n:]...)
	if len(s.pending) == 0 {
		s.stopPendingTimerLocked()
	}
	tokens := make([]string, n)
	for i, w := range ws {
		w.pending = false
		w.carried = make(chan struct{})
		tokens[i] = w.token
	}
	return ws, tokens
}

// endRelease ends what beginRelease began, once the call has returned and
// the waiters it carried know what became of them: they are no longer
// carried, and a waiter that gave up meanwhile may now be released. The
// last release in flight sends the waiters still pending.
func (s *Semaphore) endRelease(ws []*waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		close(w.carried)
		w.carried = nil
	}
	s.releasing--
	if s.releasing == 0 {
		s.carryPendingLocked()
	}
}

// dropPendingLocked takes w out of the pending list, if it is there.
func (s *Semaphore) dropPendingLocked(w *waiter) {
	if !w.pending {
		return
	}
	w.pending = false
	for i, v := range s.pending {
		if v == w {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			break
		}
	}
	if len(s.pending) == 0 {
		s.stopPendingTimerLocked()
	}
}

func (s *Semaphore) stopPendingTimerLocked() {
	if s.pendingTimer != nil {
		s.pendingTimer.Stop()
		s.pendingTimer = nil
	}
}

// settleCarried tells the waiters a call carried what became of them. err
// is the call's error; tickets are the places they took, in order (-1:
// never grantable), when it succeeded. It runs before the grants the call
// made are handed over, so that a carried waiter granted by the same call
// is a known one by then.
// retry says whether the call may have run although it failed.
func (s *Semaphore) settleCarried(ws []*waiter, tickets []int64, limit int64, sent time.Time, err error, retry bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, w := range ws {
		if s.waiters[w.token] != w {
			continue // gave up meanwhile: giveUp releases it once carried is closed
		}
		switch {
		case err != nil:
			// Ask on its own. If the carrier may have run before its
			// reply was lost, the call is a retry, and acquire.lua tells
			// whether Redis knows the token.
			w.ch <- wakeup{send: true, retry: retry}
		case tickets[i] == 0:
			// Redis knew the token already, and did not queue it (a
			// tombstone: bury in scripts/lib.lua). Not reached by a
			// waiter that still waits, but should it be: ask again,
			// as a retry, which moves it to a new token.
			w.ch <- wakeup{send: true, retry: true}
		case tickets[i] < 0:
			delete(s.waiters, w.token)
			w.ch <- wakeup{err: fmt.Errorf("%w: asked for %d, the limit is %d", ErrExceedsLimit, w.weight, limit)}
		default:
			if sent.After(w.heartbeat) {
				w.heartbeat = sent
			}
			w.known = true
			s.startBackgroundLocked()
		}
	}
}
