package semaphore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
)

// watch refreshes, every Lease/3 and in one Redis call, the leases of this
// process's permits and the heartbeats of its waiters, and cancels a permit
// whose lease is lost. It runs from the first wait or grant until Close. It
// refreshes at once when kicked (Redis answers again after an outage, a
// grant needs checking), and while Redis does not answer it retries with
// backoff rather than at the next tick: the first refresh Redis answers
// tells holders and waiters what Redis kept.
func (s *Semaphore) watch() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.Lease / 3)
	defer t.Stop()
	var bo backoff.Backoff
	var retry <-chan time.Time
	failing := false
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.kick:
		case <-retry:
		}
		retry = nil
		n, err := s.refresh()
		switch {
		case err == nil:
			bo.Reset()
			failing = false
		case errors.Is(err, ErrClosed):
			return
		case mayPass(err):
			wait := bo.Next()
			if !failing {
				level := slog.LevelWarn
				if transient(err) {
					level = slog.LevelDebug // the handle's outage log warned of the outage once
				}
				s.log.Log(context.Background(), level, "semaphore: refreshing leases failed; retrying until Redis answers; permits stay valid until their leases run out", "error", err, "permits_and_waiters", n)
				failing = true
			}
			retry = time.After(wait)
		default:
			s.log.Warn("semaphore: refreshing leases failed; permits stay valid until their leases run out", "error", err, "permits_and_waiters", n)
		}
	}
}

// refresh makes one refresh call, if this process has anything to refresh,
// and acts on Redis's answer. It returns how many tokens it refreshed, and
// the call's error.
func (s *Semaphore) refresh() (int, error) {
	// First, without Redis: a permit whose last confirmed deadline has passed
	// may already be someone else's. This is what cancels a holder at once
	// when its process resumes from a pause, or during a Redis outage.
	now := time.Now()
	var lost []*Permit
	s.mu.Lock()
	snapshot := make([]*Permit, 0, len(s.holders)+len(s.waiters)) // nil for a waiter
	tokens := make([]any, 0, cap(snapshot))
	for tok, p := range s.holders {
		if p.expired(now.Add(expiryMargin(s.opts.Lease))) {
			delete(s.holders, tok)
			lost = append(lost, p)
			continue
		}
		tokens = append(tokens, tok)
		snapshot = append(snapshot, p)
	}
	for tok, w := range s.waiters {
		if w.known {
			tokens = append(tokens, tok)
			snapshot = append(snapshot, nil)
		}
	}
	s.mu.Unlock()
	for _, p := range lost {
		s.log.Warn("semaphore: lease lost: the permit was not refreshed in time", "permit", p.token, "fence", p.fence)
		p.lose(ErrLeaseLost)
	}
	if len(tokens) == 0 {
		return 0, nil
	}

	// Give up on the call in time to tell a holder its lease is lost before
	// Redis may hand its permit on (a blackholed connection answers never).
	deadline := now.Add(s.opts.Lease / 3)
	for _, p := range snapshot {
		if p != nil {
			deadline = earliest(deadline, p.deadline().Add(-expiryMargin(s.opts.Lease)))
		}
	}
	ctx, cancel := bounded(context.Background(), time.Until(deadline))
	defer cancel()
	sent := time.Now()
	lease := s.opts.Lease.Milliseconds()
	res, err := s.evalUntil(ctx, "", scriptRefresh, append([]any{lease, lease}, tokens...)...)
	if err != nil {
		return len(tokens), err
	}
	statuses, _ := res.([]any)
	if len(statuses) != len(tokens) {
		return len(tokens), fmt.Errorf("unexpected reply %v from the refresh script", res)
	}
	for i, t := range tokens {
		st, _ := statuses[i].(int64)
		if p := snapshot[i]; p != nil {
			s.applyHolderRefresh(p, st, sent)
		} else {
			s.applyWaiterRefresh(t.(string), st, sent)
		}
	}
	return len(tokens), nil
}

// applyHolderRefresh acts on Redis's word about a token that held a permit
// here when the refresh was sent: st == p's fence still holds; anything
// else means the lease was lost.
func (s *Semaphore) applyHolderRefresh(p *Permit, st int64, sent time.Time) {
	if st == p.fence {
		p.extend(sent.Add(s.opts.Lease))
		return
	}
	// Unknown to Redis, or (should tokens ever be reused) another grant.
	s.mu.Lock()
	current := s.holders[p.token] == p
	if current {
		delete(s.holders, p.token)
	}
	s.mu.Unlock()
	if current { // not released while the refresh was under way
		s.log.Warn("semaphore: lease lost: Redis no longer holds the permit", "permit", p.token, "fence", p.fence)
		p.lose(ErrLeaseLost)
	}
}

// applyWaiterRefresh acts on Redis's word about a token that waited here
// when the refresh was sent. The waiter may have been granted since, so its
// status is only news while the token still waits.
func (s *Semaphore) applyWaiterRefresh(token string, st int64, sent time.Time) {
	switch {
	case st > 0:
		// Granted, and the wake-up is late or lost: deliver it now (a
		// duplicate of the dispatcher's delivery is ignored).
		s.deliver(token, st, sent, s.unconfirmed())
	case st == 0:
		s.mu.Lock()
		if w, ok := s.waiters[token]; ok {
			w.heartbeat = sent
		}
		s.mu.Unlock()
	default:
		s.requeue(token) // a no-op unless the token still waits
	}
}

// expiryMargin is how long before the last lease deadline Redis confirmed
// a holder is told its lease is lost, when no refresh got through: long
// enough for the work it guards to stop (a query cancelled on the server)
// before Redis may hand the permit on, and more than the longest wait
// between refresh retries during an outage (1s). A tenth of the lease,
// at most 2s.
func expiryMargin(lease time.Duration) time.Duration {
	return min(lease/10, 2*time.Second)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
