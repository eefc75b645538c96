package semaphore_test

// The short hand-off (handoff in scripts/lib.lua): under contention a
// release passes its permit straight to the queue's head, skipping the
// purge and the reading of the holders. These tests pin down when it may,
// and what Redis holds after it; TestFencesStrictlyIncrease checks S1 and
// S5 across processes while most releases take it, and
// TestWaitersAreGrantedInTicketOrder S2.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// A release with another process's waiter at the head of the queue hands
// it the permit in the short call, and leaves Redis exactly as the whole
// release would have: the waiter holds under the next fence with its
// heartbeat deadline as its first lease, its place and heartbeat are gone,
// the releaser's entries are gone, and the held record is true.
func TestAReleaseHandsItsPermitStraightToTheHeadOfTheQueue(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	a, b, p, got := heldAndQueued(t, rdb, prefix, semaphore.Options{Limit: 1})
	k := prefix + ":{db}:"
	head := stats(t, a).Waiters[0].ID
	heartbeat, err := rdb.ZScore(ctx, k+"alive", head).Result()
	if err != nil {
		t.Fatal(err)
	}

	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := receiveGrant(t, got, 5*time.Second, "the head of the queue")
	if a.Handoffs() != 1 {
		t.Fatalf("handoffs = %d, want the release to have taken the short hand-off", a.Handoffs())
	}
	if q.ID() != head || q.Fence() != p.Fence()+1 {
		t.Fatalf("granted %s with fence %d, want %s with fence %d", q.ID(), q.Fence(), head, p.Fence()+1)
	}
	holders, _ := rdb.ZRangeWithScores(ctx, k+"holders", 0, -1).Result()
	if len(holders) != 1 || holders[0].Member != head || holders[0].Score != heartbeat {
		t.Errorf("holders %v, want only %s with its heartbeat deadline %.0f as its lease", holders, head, heartbeat)
	}
	if n, _ := rdb.ZCard(ctx, k+"queue").Result(); n != 0 {
		t.Errorf("%d waiters still queued, want none", n)
	}
	if n, _ := rdb.ZCard(ctx, k+"alive").Result(); n != 0 {
		t.Errorf("%d heartbeats left, want none", n)
	}
	info, _ := rdb.HGetAll(ctx, k+"info").Result()
	if _, ok := info[p.ID()]; ok || len(info) != 1 || !strings.HasPrefix(info[head], fmt.Sprintf("%d:", q.Fence())) {
		t.Errorf("info %v, want only %s's \"fence:grantedAt\"", info, head)
	}
	if rec, _ := rdb.Get(ctx, k+"held").Result(); rec != fmt.Sprintf("%d:1:1", q.Fence()) {
		t.Errorf("held record %q, want %q", rec, fmt.Sprintf("%d:1:1", q.Fence()))
	}
	// The new holder's refresh and release see it as any grant's.
	st := stats(t, b)
	if len(st.Holders) != 1 || st.Holders[0].Fence != q.Fence() {
		t.Errorf("Stats holders %+v, want %s with fence %d", st.Holders, head, q.Fence())
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, a); st.Held != 0 || len(st.Waiters) != 0 {
		t.Errorf("after both releases: %+v, want nothing held or queued", st)
	}
}

// The head of the queue in the releasing process itself comes back in the
// reply, and its Acquire returns without a wake-up.
func TestAReleaseHandsItsPermitStraightToItsOwnWaiter(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	a := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	p := mustAcquire(t, a)
	got := acquireQueued(t, a, a, 1)
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	q := receiveGrant(t, got, 5*time.Second, "the process's own waiter")
	if a.Handoffs() != 1 || q.Fence() != p.Fence()+1 {
		t.Fatalf("handoffs %d, fence %d; want 1 and %d", a.Handoffs(), q.Fence(), p.Fence()+1)
	}
	if err := q.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// When the short hand-off may not be taken, the whole release runs, and
// does what it always did.
func TestAReleaseTakesTheWholeScriptWhenTheShortHandOffMayNotServe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("the head's heartbeat has lapsed", func(t *testing.T) {
		t.Parallel()
		// A dead head must be purged, not granted: the whole release purges
		// it and grants the live waiter behind it.
		rdb, prefix := testenv.Redis(t)
		a, _, p, _ := heldAndQueued(t, rdb, prefix, semaphore.Options{Limit: 1})
		dead := stats(t, a).Waiters[0].ID
		c := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
		got := acquireQueued(t, c, a, 2)
		if err := rdb.ZAdd(ctx, prefix+":{db}:alive", redis.Z{Score: 1, Member: dead}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		q := receiveGrant(t, got, 5*time.Second, "the live waiter behind a dead head")
		if a.Handoffs() != 0 {
			t.Errorf("handoffs = %d, want the whole release", a.Handoffs())
		}
		for _, w := range stats(t, a).Waiters {
			if w.ID == dead {
				t.Errorf("the dead head %s is still queued", dead)
			}
		}
		_ = q.Release(ctx)
	})

	t.Run("the head weighs more than the permit", func(t *testing.T) {
		t.Parallel()
		rdb, prefix := testenv.Redis(t)
		a := newSem(t, rdb, prefix, semaphore.Options{Limit: 2})
		p1, p2 := mustAcquire(t, a), mustAcquire(t, a)
		got := acquireNQueued(t, newSem(t, rdb, prefix, semaphore.Options{Limit: 2}), a, 2, 1)
		if err := p1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if st := stats(t, a); st.Held != 1 || len(st.Waiters) != 1 {
			t.Fatalf("after one release of weight 1: %+v, want 1 held and the weight-2 head still waiting", st)
		}
		if err := p2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		q := receiveGrant(t, got, 5*time.Second, "the heavy head")
		if a.Handoffs() != 0 {
			t.Errorf("handoffs = %d, want none across weights", a.Handoffs())
		}
		_ = q.Release(ctx)
	})

	t.Run("the limit was lowered below what is held", func(t *testing.T) {
		t.Parallel()
		// S1 under a lowered limit: nobody new is granted until what is
		// held fits, so a swap must not keep the held weight above it.
		rdb, prefix := testenv.Redis(t)
		a := newSem(t, rdb, prefix, semaphore.Options{Limit: 2})
		p1, p2 := mustAcquire(t, a), mustAcquire(t, a)
		got := acquireQueued(t, newSem(t, rdb, prefix, semaphore.Options{Limit: 2}), a, 1)
		if err := a.SetLimit(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := p1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case q := <-got:
			t.Fatalf("granted %v while 1 was still held under the lowered limit 1", q)
		case <-time.After(200 * time.Millisecond):
		}
		if a.Handoffs() != 0 {
			t.Errorf("handoffs = %d, want none while what is held exceeds the lowered limit", a.Handoffs())
		}
		// Now what is held fits: this one may go straight to the head.
		if err := p2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		q := receiveGrant(t, got, 5*time.Second, "the head, once the held weight fits")
		_ = q.Release(ctx)
	})

	t.Run("a grant took a fence the held record does not name", func(t *testing.T) {
		t.Parallel()
		// An older batchmr grants without the record (it only increments
		// the fence counter): the record no longer names the holders.
		rdb, prefix := testenv.Redis(t)
		a, _, p, got := heldAndQueued(t, rdb, prefix, semaphore.Options{Limit: 1})
		taken, err := rdb.Incr(ctx, prefix+":{db}:fence").Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		q := receiveGrant(t, got, 5*time.Second, "the head")
		if a.Handoffs() != 0 || q.Fence() <= taken {
			t.Errorf("handoffs %d, fence %d; want the whole release, and a fence above %d", a.Handoffs(), q.Fence(), taken)
		}
		_ = q.Release(ctx)
	})

	t.Run("the permit's lease was lost", func(t *testing.T) {
		t.Parallel()
		// A process cannot vouch for a permit whose lease it lost: Redis
		// may have marked it lost or handed it on.
		rdb, prefix := testenv.Redis(t)
		h := &faultHook{refuse: func(cmd redis.Cmder) bool { return isScript(cmd, semaphore.RefreshScript) }}
		hooked := redis.NewClient(rdb.Options())
		hooked.AddHook(h)
		t.Cleanup(func() { _ = hooked.Close() })
		a := newSem(t, hooked, prefix, semaphore.Options{Limit: 1, Lease: 300 * time.Millisecond})
		p := mustAcquire(t, a)
		got := acquireQueued(t, newSem(t, rdb, prefix, semaphore.Options{Limit: 1}), newSem(t, rdb, prefix, semaphore.Options{Limit: 1}), 1)
		select {
		case <-p.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the unrefreshed lease was never lost")
		}
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
			t.Errorf("Release = %v, want ErrLeaseLost", err)
		}
		q := receiveGrant(t, got, 5*time.Second, "the waiter, once the lost permit is gone")
		if a.Handoffs() != 0 {
			t.Errorf("handoffs = %d, want none for a lost permit", a.Handoffs())
		}
		_ = q.Release(ctx)
	})
}

// An acquire behind a full semaphore only takes a place (queue_short): it
// trusts the held record only as the whole script does, so a holder
// removed without the record (by an operator, or an older batchmr) leaves
// the next acquire granted at once, not queued behind free capacity.
func TestAnAcquireTrustsTheHeldRecordOnlyWhileItNamesTheHolders(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	a := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	p := mustAcquire(t, a)
	if err := rdb.ZRem(ctx, prefix+":{db}:holders", p.ID()).Err(); err != nil {
		t.Fatal(err)
	}
	b := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	q, err := b.Acquire(actx)
	if err != nil {
		t.Fatalf("Acquire with the only holder gone = %v, want a grant at once", err)
	}
	_ = q.Release(ctx)
}

// The short calls skip the purge, so a crashed holder's permit is purged
// by the next full call: the waiters' own watchdog refresh, within S3's
// bound (its lease and one check interval), even while every other call
// is a short one.
func TestACrashedHoldersPermitReturnsWithinItsLeaseWhileCallsAreShort(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	// Long enough that one check interval plus slack (a loaded machine
	// under -race) stays well short of a lease.
	const lease = 3 * time.Second
	// A holder whose process died: its lease ran out, and nobody has
	// called since; the held record names it, so an acquire queues short.
	k := prefix + ":{db}:"
	for _, err := range []error{
		rdb.Set(ctx, k+"limit", 1, 0).Err(),
		rdb.Set(ctx, k+"fence", 5, 0).Err(),
		rdb.ZAdd(ctx, k+"holders", redis.Z{Score: 1, Member: "crashed-1-x:1:1"}).Err(),
		rdb.HSet(ctx, k+"info", "crashed-1-x:1:1", "5:1").Err(),
		rdb.Set(ctx, k+"held", "5:1:1", 0).Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	b := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, 10*lease)
	defer cancel()
	q, err := b.Acquire(actx)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > lease/3+slack {
		t.Errorf("granted after %v, want within about one check interval (%v)", d, lease/3)
	}
	if q.Fence() != 6 {
		t.Errorf("fence %d, want 6", q.Fence())
	}
	if st := stats(t, b); len(st.Holders) != 1 || st.Holders[0].ID != q.ID() {
		t.Errorf("holders %+v, want only the new one", st.Holders)
	}
	_ = q.Release(ctx)
}
