package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// On Redis Cluster every multi-key script must touch one slot, or the
// server refuses it with CROSSSLOT. This runs the whole life cycle on a real
// cluster and checks every key the semaphore wrote lives in one slot.
func TestWorksOnRedisCluster(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.RedisCluster(t)
	ctx := context.Background()
	a, b, p, got := heldAndQueued(t, rdb, prefix, semaphore.Options{Limit: 1})
	st := stats(t, a)
	keys := []string{prefix + ":{db}:wake:" + st.Waiters[0].Process}
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
	r, err := a.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testenv.KeysInOneSlot(t, rdb, prefix, 5, keys...)
	// The function library was loaded on the node that owns the slot.
	if !semaphore.ForcedEval() && serverHasFunctions(t, rdb) && (!a.UsesFunctions() || !b.UsesFunctions()) {
		t.Error("the semaphore fell back to EVALSHA on a cluster that has functions")
	}
	_ = q.Release(ctx)
	_ = r.Release(ctx)
}

// Semaphores of different names hash to different slots, which a Cluster
// may give to different primaries: each keeps all its keys on its own
// primary, and hands its permit over there.
func TestSemaphoresOfDifferentNamesWorkOnDifferentPrimaries(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.RedisCluster(t)
	ctx := context.Background()
	names := testenv.TagsOnDifferentPrimaries(t, rdb, 2)
	var grants []*semaphore.Permit
	for _, name := range names {
		var handles [2]*semaphore.Semaphore
		for i := range handles {
			s, err := semaphore.New(rdb, name, semaphore.Options{Limit: 1, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			handles[i] = s
		}
		p := mustAcquire(t, handles[0])
		got := acquireQueued(t, handles[1], handles[0], 1)
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		grants = append(grants, receiveGrant(t, got, 10*time.Second, "the waiter of "+name+", after the release"))
	}
	testenv.PrimariesOfTags(t, rdb, prefix, "semaphore", names...)
	for _, name := range names {
		testenv.KeysInOneSlot(t, rdb, prefix+":{"+name+"}", 3)
	}
	for _, q := range grants {
		if err := q.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}
