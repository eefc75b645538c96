package semaphore

import (
	"context"
	"errors"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
	"github.com/batchmr/batchmr/internal/outage"
)

// How a handle lives through a Redis outage: every call that fails for a
// reason that may pass is retried with backoff, and the first call that
// Redis answers again wakes the others and asks the watchdog for a refresh
// at once, so that holders and waiters learn what Redis kept (a restart
// without persistence keeps nothing) within moments rather than at the next
// Lease/3 tick.

// mayPass reports whether a call failed for a reason that may go away by
// itself: Redis unreachable, restarting (LOADING), failing over, or too slow
// to answer before the call's own deadline.
func mayPass(err error) bool {
	return transient(err) || errors.Is(err, context.DeadlineExceeded)
}

// noteCall records what the outcome of a call says about Redis: a
// transient failure that it may be down, any answer (a reply, or an error
// Redis itself sent, such as WRONGTYPE) that it is up. kick is false for the
// watchdog's own refresh, which needs no second refresh to follow it.
func (s *Semaphore) noteCall(err error, kick bool) {
	switch {
	case err == nil || isServerError(err) && !transient(err):
		s.redisAnswered(kick)
	case transient(err):
		s.redisFailed(err)
	}
}

// redisFailed marks Redis as unreachable and counts the failure in the
// handle's outage log: a warning at the first failure of each cause
// (unreachable, failing over) and once a minute while it lasts, the others
// at debug, so that however many calls retry, an outage is a few lines.
// The first failure of an outage asks the watchdog for a refresh, which
// then retries with backoff: it is the handle's probe for Redis coming
// back, even while nothing else calls.
func (s *Semaphore) redisFailed(err error) {
	s.healthMu.Lock()
	first := !s.down.Load()
	if first {
		s.down.Store(true)
		s.back = make(chan struct{})
	}
	s.healthMu.Unlock()
	s.outages.Failed(nil, outageOf(err), "", err)
	if first {
		s.kickWatchdog()
	}
}

// outageOf is the outage that err, a transient failure, belongs to: a
// reply of Redis's own (READONLY, LOADING, …) is a failover's, anything
// else (refused, dropped, unanswered) Redis unreachable.
func outageOf(err error) outage.Cause {
	if isServerError(err) {
		return outage.RedisFailover
	}
	return outage.Redis
}

// redisAnswered marks Redis as reachable. After an outage it wakes every
// retry that is waiting out its backoff, and (if kick) asks the watchdog
// for a refresh now: waiters that Redis forgot re-queue, grants whose
// wake-up was lost are handed over, holders whose permits are gone are told.
func (s *Semaphore) redisAnswered(kick bool) {
	if !s.down.Load() {
		return
	}
	s.healthMu.Lock()
	was := s.down.Load()
	if was {
		s.down.Store(false)
		close(s.back)
		s.back = nil
	}
	s.healthMu.Unlock()
	if !was {
		return
	}
	// One info line per cause that failed: how long it lasted, and how
	// many calls failed for it.
	s.outages.Ended(outage.Redis, "")
	s.outages.Ended(outage.RedisFailover, "")
	if kick {
		s.kickWatchdog()
	}
}

// pause waits d before a retry, less if Redis answers another call of this
// handle meanwhile — but never less than backoff.DefaultMin, so that a caller whose
// calls fail while others succeed cannot spin. It returns ctx's error if
// ctx is done first, and ErrClosed if the Semaphore is closed first.
func (s *Semaphore) pause(ctx context.Context, d time.Duration) error {
	s.healthMu.Lock()
	back := s.back // nil, never ready, unless Redis is known to be down
	s.healthMu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	floor := time.NewTimer(min(d, backoff.DefaultMin))
	defer floor.Stop()
	floorPassed, answered := false, false
	for !floorPassed || !answered {
		select {
		case <-t.C:
			return nil
		case <-floor.C:
			floorPassed = true
		case <-back:
			answered, back = true, nil
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return ErrClosed
		}
	}
	return nil
}

// kickWatchdog asks the watchdog for a refresh now. A watchdog that is not
// running finds the request when it starts.
func (s *Semaphore) kickWatchdog() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// stopped reports whether Close has begun.
func (s *Semaphore) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}
