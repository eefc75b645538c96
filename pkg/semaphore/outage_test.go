package semaphore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// clientVia returns a client of the test Redis whose connections pass
// through addr (a proxy, or a dead or silent port).
func clientVia(t *testing.T, addr string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.Addr = addr
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func redisAddr(t *testing.T) string {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return opt.Addr
}

func TestAcquireWithRedisDownReturnsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close() // nothing listens here now: connection refused
	_, prefix := testenv.Redis(t)
	s := newSem(t, clientVia(t, dead), prefix, semaphore.Options{Limit: 1})

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Acquire(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Redis") {
		t.Errorf("Acquire with Redis down = %v, want DeadlineExceeded naming the Redis error", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Acquire returned %v after a 300ms deadline", took)
	}
	if _, err := s.TryAcquire(context.Background()); err == nil || errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("TryAcquire with Redis down = %v, want the Redis error", err)
	}
}

func TestAcquireWithRedisSilentReturnsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	// A server that accepts and never answers: go-redis alone would wait
	// for its read timeout, longer than the caller's deadline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	_, prefix := testenv.Redis(t)
	s := newSem(t, clientVia(t, ln.Addr().String()), prefix, semaphore.Options{Limit: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := s.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire against a silent server = %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Acquire returned %v after a 200ms deadline", took)
	}
}

func TestAcquireReturnsAPermanentRedisErrorAtOnce(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	// Someone else's data under our key: no retry will fix that.
	if err := rdb.HSet(context.Background(), prefix+":{db}:limit", "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(context.Background()) // no deadline: a retry loop would hang
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), `semaphore "db": acquire`) {
		t.Errorf("Acquire over a wrong-typed key = %v, want the WRONGTYPE error, wrapped", err)
	}
}

func TestHolderKeepsItsPermitAcrossAShortOutage(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	s, other, px := cutOffPair(t, lease, 0)
	ctx := context.Background()
	p := mustAcquire(t, s)
	px.cut()
	time.Sleep(300 * time.Millisecond)
	if _, err := other.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("during the outage another process got the permit: %v", err)
	}
	px.restore()
	time.Sleep(lease) // long enough that the permit would expire unless refreshed after the outage
	if err := p.Context().Err(); err != nil {
		t.Fatalf("permit cancelled across a short outage: %v", context.Cause(p.Context()))
	}
	if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != p.ID() {
		t.Fatalf("after the outage Redis shows %+v, want our permit", st)
	}
	if err := p.Release(ctx); err != nil {
		t.Errorf("Release after a short outage = %v", err)
	}
}

func TestHolderCutOffPastItsLeaseIsCancelled(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	s, other, px := cutOffPair(t, lease, 0)
	ctx := context.Background()
	p := mustAcquire(t, s)
	px.cut()
	select {
	case <-p.Context().Done():
		if !errors.Is(context.Cause(p.Context()), semaphore.ErrLeaseLost) {
			t.Errorf("cause = %v, want ErrLeaseLost", context.Cause(p.Context()))
		}
	case <-time.After(lease + lease/3 + 2*time.Second):
		t.Fatal("a holder cut off from Redis past its lease was not cancelled")
	}
	q := mustAcquire(t, other)
	defer q.Release(ctx)
	px.restore()
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Errorf("Release after losing the lease = %v, want ErrLeaseLost", err)
	}
	if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != q.ID() {
		t.Errorf("the late Release disturbed the new holder: %+v", st)
	}
}

func TestWaiterWhoseHeartbeatLapsedDuringAnOutageQueuesAgain(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	s, other, px := cutOffPair(t, lease, time.Minute)
	ctx := context.Background()
	p := mustAcquire(t, other)
	got := acquireQueued(t, s, other, 1)
	px.cut()
	waitFor(t, 5*time.Second, "Redis to drop the silent waiter", func() bool { return len(stats(t, other).Waiters) == 0 })
	px.restore()
	waitFor(t, 5*time.Second, "the waiter to queue again", func() bool { return len(stats(t, other).Waiters) == 1 })
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case q := <-got:
		if q == nil {
			t.Fatal("the re-queued waiter's Acquire failed")
		}
		if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != q.ID() {
			t.Errorf("the re-queued waiter's permit is not the one Redis holds: %+v", st)
		}
		if err := q.Release(ctx); err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the re-queued waiter was never granted")
	}
}

// A Redis that restarts without persistence comes back empty: no holders,
// no queue, no limit, no function library. Holders must learn that their
// permits are gone (ErrLeaseLost) rather than go on as if they held them;
// waiters must queue again and be granted under the limit their handles
// configure; and Release must say the permit was lost.
func TestRedisRestartWithoutPersistenceLosesHoldersAndRequeuesWaiters(t *testing.T) {
	t.Parallel()
	rdb, restart := testenv.PrivateRedis(t)
	ctx := context.Background()
	const lease = 600 * time.Millisecond
	opts := semaphore.Options{Limit: 1, Lease: lease}
	a, b := newSem(t, rdb, "restart", opts), newSem(t, rdb, "restart", opts)
	// A limit in Redis other than the configured one, to tell them apart.
	if err := a.SetLimit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	p, err := a.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireQueued(t, b, a, 1)

	restart()
	select {
	case <-p.Context().Done():
		if cause := context.Cause(p.Context()); !errors.Is(cause, semaphore.ErrLeaseLost) {
			t.Errorf("holder's context cause after the restart = %v, want ErrLeaseLost", cause)
		}
	case <-time.After(lease + lease/3 + 5*time.Second):
		t.Fatal("the holder was not told that the restart took its permit")
	}
	q := receiveGrant(t, got, lease+10*time.Second, "the waiter, after the restart")
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Errorf("Release of the lost permit = %v, want ErrLeaseLost", err)
	}
	st, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Limit != 1 || len(st.Holders) != 1 || st.Holders[0].ID != q.ID() || len(st.Waiters) != 0 {
		t.Errorf("after the restart: limit %d, holders %v, waiters %v; want the configured limit 1 (not the 2 set before) and the waiter holding", st.Limit, st.Holders, st.Waiters)
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
