package semaphore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// The scripts keep the holders' total weight in a record rather than
// summing every holder on each call. Anything else that changes the
// holders (an operator, an eviction) leaves the record behind, so these
// tests change the holders by hand and check that the limit still holds
// (S1) and that freed capacity is still granted.

// grantByHand adds a holder as an operator might, keeping no record: a new
// fence, the holder with a lease, its info.
func grantByHand(t *testing.T, rdb redis.UniversalClient, prefix, token string) {
	t.Helper()
	ctx := context.Background()
	k := prefix + ":{db}:"
	fence, err := rdb.Incr(ctx, k+"fence").Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	deadline := now.Add(time.Minute).UnixMilli()
	if err := rdb.ZAdd(ctx, k+"holders", redis.Z{Score: float64(deadline), Member: token}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, k+"info", token, strconv.FormatInt(fence, 10)+":"+strconv.FormatInt(now.UnixMilli(), 10)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestAHolderAddedWithoutTheRecordStillCountsTowardTheLimit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 3})
	ctx := context.Background()
	p := mustAcquire(t, s) // the record now says: one holder, weight 1
	grantByHand(t, rdb, prefix, "older-1-x:1:2")

	if q, err := s.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("TryAcquire with weight 1+2 of 3 held = %v, %v; want ErrNoPermit (a stale record would grant a 4th unit)", q, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Weight 2 of 3 is held now: one unit is free, two are not.
	if _, err := s.TryAcquireN(ctx, 2); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("TryAcquireN(2) with weight 2 of 3 held = %v; want ErrNoPermit", err)
	}
	if _, err := s.TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire with weight 2 of 3 held = %v; want a permit", err)
	}
}

func TestAHolderRemovedWithoutTheRecordFreesItsWeight(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 3})
	ctx := context.Background()
	grantByHand(t, rdb, prefix, "older-1-x:1:2")
	mustAcquire(t, s) // the record now says: weight 3, full
	if _, err := s.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("TryAcquire when full = %v; want ErrNoPermit", err)
	}
	// The older version's release: the holder leaves, no record is written.
	k := prefix + ":{db}:"
	if err := rdb.ZRem(ctx, k+"holders", "older-1-x:1:2").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HDel(ctx, k+"info", "older-1-x:1:2").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquireN(ctx, 2); err != nil {
		t.Fatalf("TryAcquireN(2) after weight 2 of 3 left = %v; want a permit (a stale record would say full)", err)
	}
}

// A record that is not well-formed (an edit by hand) is ignored: the weight
// is summed afresh.
func TestAMalformedRecordIsIgnored(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 2})
	ctx := context.Background()
	mustAcquire(t, s)
	if err := rdb.Set(ctx, prefix+":{db}:held", "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire with 1 of 2 held and a malformed record = %v; want a permit", err)
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("TryAcquire with 2 of 2 held = %v; want ErrNoPermit", err)
	}
}

// A release that finds a dead waiter at the head of the queue purges it and
// grants the live one behind it, in the same call. (The held record's first
// version lost its count in that step, and the release failed.)
func TestAReleaseGrantsPastADeadWaiterAtTheHead(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	a, _, p, got := heldAndQueued(t, rdb, prefix, semaphore.Options{Limit: 1})
	// A waiter whose heartbeat lapsed, ahead of b: ticket 0, never issued.
	ctx := context.Background()
	k := prefix + ":{db}:"
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	const dead = "dead-1-x:1:1"
	if err := rdb.ZAdd(ctx, k+"queue", redis.Z{Score: 0, Member: dead}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, k+"alive", redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: dead}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	q := receiveGrant(t, got, 5*time.Second, "the live waiter behind the dead one")
	if st := stats(t, a); len(st.Holders) != 1 || st.Holders[0].ID != q.ID() || len(st.Waiters) != 0 {
		t.Errorf("after the release Redis shows %+v; want %s holding and nobody waiting", st, q.ID())
	}
}
