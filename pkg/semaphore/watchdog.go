package semaphore

import (
	"context"
	"time"
)

// watch refreshes, every Lease/3 and in one Redis call, the leases of this
// process's permits and the heartbeats of its waiters, and cancels a permit
// whose lease is lost. It runs from the first wait or grant until Close.
func (s *Semaphore) watch() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.refresh()
		case <-s.kick:
			s.refresh()
		}
	}
}

func (s *Semaphore) refresh() {
	// First, without Redis: a permit whose last confirmed deadline has passed
	// may already be someone else's. This is what cancels a holder at once
	// when its process resumes from a pause, or during a Redis outage.
	now := time.Now()
	var lost []*Permit
	s.mu.Lock()
	snapshot := make([]*Permit, 0, len(s.holders)+len(s.waiters)) // nil for a waiter
	tokens := make([]any, 0, cap(snapshot))
	for tok, p := range s.holders {
		if p.expired(now) {
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
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Lease/3)
	defer cancel()
	sent := time.Now()
	lease := s.opts.Lease.Milliseconds()
	res, err := s.evalUntil(ctx, "", scriptRefresh, append([]any{lease, lease}, tokens...)...)
	if err != nil {
		s.log.Warn("semaphore: refreshing leases failed; permits stay valid until their leases run out", "error", err, "permits_and_waiters", len(tokens))
		return
	}
	statuses, _ := res.([]any)
	if len(statuses) != len(tokens) {
		s.log.Warn("semaphore: unexpected reply from the refresh script", "reply", res)
		return
	}
	for i, t := range tokens {
		st, _ := statuses[i].(int64)
		if p := snapshot[i]; p != nil {
			s.applyHolderRefresh(p, st, sent)
		} else {
			s.applyWaiterRefresh(t.(string), st, sent)
		}
	}
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
		s.deliver(token, st, sent)
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
