package semaphore

import (
	"context"
	"time"
)

// An acquire call can reach Redis after its caller gave its token up. When
// a call's reply is lost (a network that drops packets, a blackholed
// connection), the request itself may still be on its way: TCP delivers
// it once the network heals, even after the client has timed out, retried
// under a new token and given the old one back. If the give-back gets
// there first, it finds nothing (the release script's "unknown"), and the
// late call then queues the old token or grants it a permit that nobody in
// this process will use or refresh: taken until its lease runs out, and
// for one more Lease, since Redis keeps a live process's lapsed permits
// for it to release (purge_holders). The fault suite saw a permit held
// that way 6 s after its run ended, with three permits in all.
//
// So a detached give-back that finds nothing watches its token for a
// while (watchLate): it gives it back again after 250 ms, then at doubling
// intervals up to Lease/3, until a give-back finds something (the late
// call landed, and is undone) or lateWindow passes with Redis answering
// and nothing found. A grant that reaches the dispatcher (or a refresh)
// for a watched token, a queued late call's, is given back at once
// (landedLocked). A permit a late call was granted outright is given back
// at the watcher's next look.

// lateFirstLook is how long a watcher waits before its first look: a call
// sent before an outage lands within moments of the network healing.
const lateFirstLook = 250 * time.Millisecond

// lateWindow is how long a watcher goes on looking once Redis answers
// again and finds nothing: a call that lands later than that is given
// back only when its lease runs out, as before.
func (s *Semaphore) lateWindow() time.Duration { return 2 * s.opts.Lease }

// watchLate gives token back again until a give-back finds it, or the
// window passes, or the handle is closed. token was given back, and Redis
// knew nothing of it: its acquire call may yet land.
func (s *Semaphore) watchLate(token string) {
	landed := make(chan struct{}, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.late[token] = landed
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.late, token)
		s.mu.Unlock()
	}()
	look, until := lateFirstLook, time.Now().Add(s.lateWindow())
	for {
		t := time.NewTimer(look)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-landed:
			t.Stop()
		case <-t.C:
		}
		ctx, cancel := bounded(context.Background(), releaseTimeout)
		was, err := s.releaseToken(ctx, token, true, false)
		cancel()
		switch {
		case err != nil && mayPass(err):
			// Redis is away again: what was sent meanwhile lands when it
			// returns, so look soon after that, and for the whole window.
			look, until = lateFirstLook, time.Now().Add(s.lateWindow())
			continue
		case err != nil:
			s.log.Warn("semaphore: could not check for an abandoned acquire call that reached Redis late; its place or permit, if any, returns when its lease runs out",
				"token", token, "error", err)
			return
		case was != releaseUnknown:
			s.log.Info("semaphore: an acquire call reached Redis after its caller had given it up; gave its place or permit back",
				"token", token, "was_held", was == releaseHeld)
			return
		case time.Now().After(until):
			return
		}
		look = max(min(2*look, s.opts.Lease/3), lateFirstLook)
	}
}

// landedLocked wakes the watcher of token, if any, to give it back now: a
// grant for it reached this process, so its acquire call has landed.
// Called with s.mu held.
func (s *Semaphore) landedLocked(token string) {
	if landed, ok := s.late[token]; ok {
		select {
		case landed <- struct{}{}:
		default:
		}
	}
}
