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
	tokens := make([]any, 0, len(s.holders)+len(s.waiters))
	for tok, p := range s.holders {
		if p.expired(now) {
			delete(s.holders, tok)
			lost = append(lost, p)
			continue
		}
		tokens = append(tokens, tok)
	}
	for tok := range s.waiters {
		tokens = append(tokens, tok)
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
		s.applyRefresh(t.(string), st, sent)
	}
}

// applyRefresh acts on Redis's word about one token: st > 0 holds with fence
// st, 0 is queued, -1 is unknown to Redis.
func (s *Semaphore) applyRefresh(token string, st int64, sent time.Time) {
	s.mu.Lock()
	p, isHolder := s.holders[token]
	w, isWaiter := s.waiters[token]
	switch {
	case isHolder && st > 0:
		p.extend(sent.Add(s.opts.Lease))
	case isHolder:
		delete(s.holders, token)
	case isWaiter && st == 0:
		w.heartbeat = sent
	}
	s.mu.Unlock()

	switch {
	case isHolder && st <= 0:
		s.log.Warn("semaphore: lease lost: Redis no longer holds the permit", "permit", token, "fence", p.fence)
		p.lose(ErrLeaseLost)
	case isWaiter && st > 0:
		// Granted, and the wake-up is late or lost: deliver it now.
		s.deliver(token, st, sent)
	case isWaiter && st < 0:
		s.requeue(token)
	}
}
