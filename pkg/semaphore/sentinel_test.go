package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// Through Sentinels, the client asks them for the primary and the
// semaphore runs there as on one server: a permit is held, a waiter queued
// behind it is handed it on release, and the limit is changed for both.
func TestWorksThroughSentinels(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.RedisSentinel(t)
	ctx := context.Background()
	a, b, p, got := heldAndQueued(t, rdb, prefix, semaphore.Options{Limit: 1})
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := receiveGrant(t, got, 10*time.Second, "the waiter, after the release")
	if q.Fence() <= p.Fence() {
		t.Errorf("fence %d after %d", q.Fence(), p.Fence())
	}
	if err := a.SetLimit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	r, err := b.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("a second permit once the limit is 2: %v", err)
	}
	for _, p := range []*semaphore.Permit{q, r} {
		if err := p.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}
