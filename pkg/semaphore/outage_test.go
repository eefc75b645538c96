package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
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

// leaseEnd is the lease deadline that Redis holds for the permit id,
// measured from its grant (by Stats of s); 0 if Redis holds no such permit.
func leaseEnd(t *testing.T, s *semaphore.Semaphore, id string) time.Duration {
	t.Helper()
	for _, h := range stats(t, s).Holders {
		if h.ID == id {
			return h.HeldFor + h.LeaseLeft
		}
	}
	return 0
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
	// The deadline Redis holds for the permit, whose refreshes now fail.
	cutAt := leaseEnd(t, other, p.ID())
	testenv.WaitFor(t, 5*time.Second, "s to find Redis cut off", func() bool { return px.refused.Load() > 0 })
	if _, err := other.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("during the outage another process got the permit: %v", err)
	}
	px.restore()
	// Until a refresh sent after that deadline passed lands: the permit
	// would have expired unless refreshed after the outage.
	testenv.WaitFor(t, 5*lease, "a refresh past the deadline the outage left", func() bool {
		return leaseEnd(t, other, p.ID()) > cutAt+lease
	})
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
	testenv.WaitFor(t, 5*time.Second, "Redis to drop the silent waiter", func() bool { return len(stats(t, other).Waiters) == 0 })
	px.restore()
	testenv.WaitFor(t, 5*time.Second, "the waiter to queue again", func() bool { return len(stats(t, other).Waiters) == 1 })
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

// resumeWithin is how soon after Redis is back the semaphore must work
// again (requirement: 2s), plus slack for a loaded machine.
const resumeWithin = 2*time.Second + slack

// ownClient returns a client of rdb's server with a connection pool of its
// own, as another process would have: it learns of an outage, and of
// Redis's return, by itself.
func ownClient(t *testing.T, rdb *redis.Client) *redis.Client {
	t.Helper()
	opt := *rdb.Options()
	c := redis.NewClient(&opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// killRedis kills the redis-server of a PrivateRedis with SIGKILL, as a
// crash or the OOM killer would, and returns once it takes no connections.
// PrivateRedis's restart function starts it again (its kill finds the
// server already gone).
func killRedis(t *testing.T, rdb *redis.Client) {
	t.Helper()
	info, err := rdb.InfoMap(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(info["Server"]["process_id"])
	if err != nil {
		t.Fatalf("no process_id in INFO server: %v", info)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	opt := rdb.Options()
	testenv.WaitFor(t, 5*time.Second, "redis-server to die", func() bool {
		c, err := net.Dial(opt.Network, opt.Addr)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})
}

// checkS1 samples the semaphore in Redis, through a client of its own, until
// the test ends, and fails the test if the weight held ever exceeds the
// limit. Samples taken while Redis is down fail and are skipped.
func checkS1(t *testing.T, rdb *redis.Client, prefix string) {
	t.Helper()
	observer := newSem(t, ownClient(t, rdb), prefix, semaphore.Options{Limit: 1})
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if st, err := observer.Stats(context.Background()); err == nil && st.Held > st.Limit {
				t.Errorf("S1 broken: Redis shows %d held of a limit of %d: %+v", st.Held, st.Limit, st.Holders)
			}
		}
	}()
	t.Cleanup(func() { close(done); <-ended })
}

// grantsWithin receives one permit from each channel and returns them with
// the time from since to the first and to the last grant, failing the test
// if they do not all come by since + d.
func grantsWithin(t *testing.T, got []<-chan *semaphore.Permit, since time.Time, d time.Duration, what string) (ps []*semaphore.Permit, first, all time.Duration) {
	t.Helper()
	for i, ch := range got {
		q := receiveGrant(t, ch, time.Until(since.Add(d)), fmt.Sprintf("%s (waiter %d of %d)", what, i+1, len(got)))
		took := time.Since(since)
		if i == 0 || took < first {
			first = took
		}
		all = max(all, took)
		ps = append(ps, q)
	}
	return ps, first, all
}

// Fault F1 of the fault campaign: Redis is killed while holders release
// their permits, and comes back from its AOF seconds later. The releases
// must not be lost — each would otherwise leave a ghost permit in Redis for
// a whole lease (30s by default) — and neither must the place of a waiter
// that gave up during the outage, which would block the head of the queue
// for a heartbeat. Within 2s of the restart the ghosts are gone and the
// waiters behind hold the permits, although no refresh is due for 10s.
func TestReleasesDuringARedisCrashLandWhenRedisRestartsFromItsAOF(t *testing.T) {
	t.Parallel()
	rdb, restart := testenv.PrivateRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := context.Background()
	const limit = 3
	opts := semaphore.Options{Limit: limit} // the default lease: 30s
	a := newSem(t, ownClient(t, rdb), "aof", opts)
	b := newSem(t, ownClient(t, rdb), "aof", opts)
	observer := newSem(t, rdb, "aof", opts) // its client is the one restart waits on
	checkS1(t, rdb, "aof")
	var held []*semaphore.Permit
	for range limit {
		held = append(held, mustAcquire(t, a))
	}
	// At the head of the queue: a waiter that gives up during the outage.
	quitter, quit := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := b.Acquire(quitter); gaveUp <- err }()
	testenv.WaitFor(t, 5*time.Second, "the first waiter queued", func() bool { return len(stats(t, observer).Waiters) == 1 })
	var got []<-chan *semaphore.Permit
	for i := range limit {
		got = append(got, acquireQueued(t, b, observer, i+2))
	}

	killRedis(t, rdb)
	quit()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Errorf("the waiter that gave up got %v, want context.Canceled", err)
	}
	for _, p := range held {
		start := time.Now()
		if err := p.Release(ctx); err != nil {
			t.Errorf("Release with Redis down = %v, want nil: the permit was held, and its release goes on in the background", err)
		}
		if took := time.Since(start); took > time.Second+slack {
			t.Errorf("Release with Redis down blocked its caller for %v", took)
		}
	}
	restarted := time.Now() // the new server starts now, loads its AOF and answers
	restart()
	// "Is back" is when it answers: starting a server and loading its AOF
	// take what a loaded machine gives them, which is not the semaphore's.
	back := time.Now()
	answered := back.Sub(restarted)
	ps, first, all := grantsWithin(t, got, back, resumeWithin, "after Redis restarted from its AOF")
	t.Logf("the new redis-server answered %v after its start; waiters held permits %v (first) and %v (all %d) after that", answered, first, all, len(ps))
	st := stats(t, observer)
	want := map[string]bool{}
	for _, q := range ps {
		want[q.ID()] = true
	}
	if len(st.Holders) != limit || len(st.Waiters) != 0 {
		t.Errorf("after the restart Redis shows holders %+v and waiters %+v; want exactly the %d waiters' permits", st.Holders, st.Waiters, limit)
	}
	for _, h := range st.Holders {
		if !want[h.ID] {
			t.Errorf("after the restart Redis still holds %s, which no waiter was granted (a ghost)", h.ID)
		}
	}
	for _, q := range ps {
		if err := q.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// A Redis without persistence restarts empty: permits and queue are gone.
// Within 2s of the restart — not at their next refresh, 10s away with the
// default lease — holders must be told (their contexts cancelled with
// ErrLeaseLost) and waiters must queue again and be granted; and Redis must
// never show more held than the limit.
func TestHoldersAndWaitersLearnWithinSecondsThatRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	rdb, restart := testenv.PrivateRedis(t)
	ctx := context.Background()
	const limit = 2
	opts := semaphore.Options{Limit: limit} // the default lease: 30s
	a := newSem(t, ownClient(t, rdb), "empty", opts)
	b := newSem(t, ownClient(t, rdb), "empty", opts)
	observer := newSem(t, rdb, "empty", opts) // its client is the one restart waits on
	checkS1(t, rdb, "empty")
	var held []*semaphore.Permit
	for range limit {
		held = append(held, mustAcquire(t, a)) // a only ever holds
	}
	var got []<-chan *semaphore.Permit
	for i := range limit {
		got = append(got, acquireQueued(t, b, observer, i+1))
	}

	restarted := time.Now() // kill -9, and a new server starts
	restart()
	back := time.Now() // it answers (see the AOF test above)
	answered := back.Sub(restarted)
	ps, first, all := grantsWithin(t, got, back, resumeWithin, "after Redis restarted empty")
	t.Logf("the new redis-server answered %v after the kill; waiters held permits %v (first) and %v (all %d) after that", answered, first, all, len(ps))
	for _, p := range held {
		select {
		case <-p.Context().Done():
			if cause := context.Cause(p.Context()); !errors.Is(cause, semaphore.ErrLeaseLost) {
				t.Errorf("a holder's context after the restart: cause %v, want ErrLeaseLost", cause)
			}
		case <-time.After(time.Until(back.Add(resumeWithin))):
			t.Fatalf("a holder was not told within %v that the restart took its permit", resumeWithin)
		}
	}
	t.Logf("holders told %v after Redis answered", time.Since(back))
	if st := stats(t, observer); len(st.Holders) != limit || st.Limit != limit {
		t.Errorf("after the restart Redis shows %+v; want the %d waiters holding under the configured limit", st, limit)
	}
	for _, p := range held {
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
			t.Errorf("Release of a permit the restart took = %v, want ErrLeaseLost", err)
		}
	}
	for _, q := range ps {
		if err := q.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// A release that Redis could not take is retried once Redis is back, and
// when it lands it hands the permit to the next waiter even if that waiter
// is in the releasing process, which no wake-up would tell.
func TestAReleaseRetriedAfterAnOutageHandsThePermitToALocalWaiter(t *testing.T) {
	t.Parallel()
	s, other, px := cutOffPair(t, 0, 0) // the default lease: no refresh is due for 10s
	ctx := context.Background()
	p := mustAcquire(t, s)
	got := acquireQueued(t, s, other, 1)
	px.cut()
	if err := p.Release(ctx); err != nil {
		t.Errorf("Release with Redis cut off = %v, want nil (retried in the background)", err)
	}
	if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != p.ID() {
		t.Fatalf("during the outage Redis shows %+v, want the released permit still held", st)
	}
	px.restore()
	restored := time.Now()
	q := receiveGrant(t, got, resumeWithin, "the local waiter, after Redis came back")
	t.Logf("the local waiter held the permit %v after Redis came back", time.Since(restored))
	if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != q.ID() {
		t.Errorf("after the retried release Redis shows %+v, want the waiter's permit only", st)
	}
	if err := q.Release(ctx); err != nil {
		t.Error(err)
	}
}

// Cut off from Redis past its lease, a holder is cancelled; its Release
// cannot reach Redis either, and must still say that the lease was lost.
func TestReleaseCutOffAfterItsLeaseRanOutReportsTheLoss(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	s, _, px := cutOffPair(t, lease, 0)
	p := mustAcquire(t, s)
	px.cut()
	select {
	case <-p.Context().Done():
	case <-time.After(lease + lease/3 + 2*time.Second):
		t.Fatal("a holder cut off from Redis past its lease was not cancelled")
	}
	if err := p.Release(context.Background()); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Errorf("Release, cut off, of a permit whose lease ran out = %v, want ErrLeaseLost", err)
	}
}

// Close during an outage gives back what it holds in one last attempt, ends
// the retries of releases made before, and returns promptly; nothing calls
// Redis after it.
func TestCloseDuringAnOutageEndsTheRetriesAndReturnsPromptly(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	px := startProxy(t, redisAddr(t))
	c := clientVia(t, px.addr())
	calls := &cmdCounter{n: map[string]int{}}
	c.AddHook(calls)
	// The attempts to give the queued waiter's place back.
	var place atomic.Value
	place.Store("")
	var placeGivenBack atomic.Int64
	c.AddHook(&faultHook{before: func(cmd redis.Cmder) {
		if isScript(cmd, semaphore.ReleaseScript) && arg(cmd, argToken) == place.Load() {
			placeGivenBack.Add(1)
		}
	}})
	s := newSem(t, c, prefix, semaphore.Options{Limit: 2})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 2})
	ctx := context.Background()
	released, kept := mustAcquire(t, s), mustAcquire(t, s)
	queued := acquireQueued(t, s, other, 1)
	place.Store(stats(t, other).Waiters[0].ID)

	px.cut()
	if err := released.Release(ctx); err != nil {
		t.Errorf("Release with Redis cut off = %v, want nil (retried in the background)", err)
	}
	testenv.WaitFor(t, 5*time.Second, "a few retries", func() bool { return px.refused.Load() >= 3 })
	start := time.Now()
	err := s.Close()
	took := time.Since(start)
	if took > 5*time.Second+slack {
		t.Errorf("Close during an outage took %v", took)
	}
	t.Logf("Close during an outage took %v and returned %v", took, err)
	if err == nil {
		t.Errorf("Close during an outage = nil, want an error saying what it could not give back")
	}
	if cause := context.Cause(kept.Context()); !errors.Is(cause, semaphore.ErrClosed) {
		t.Errorf("a held permit's context after Close: cause %v, want ErrClosed", cause)
	}
	if q := <-queued; q != nil {
		t.Errorf("a waiter was granted %s across Close", q.ID())
	}
	// Close gives the waiter's place back, and the Acquire that Close ended
	// once more, on its own goroutine; after that, nothing may call Redis.
	testenv.WaitFor(t, 5*time.Second, "the place given back by Close and by its Acquire", func() bool { return placeGivenBack.Load() >= 2 })
	before := calls.snapshot()
	// The claim is that nothing happens: wait longer than the longest backoff.
	time.Sleep(2 * time.Second)
	if after := calls.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("calls went on after Close returned: %v, then %v", before, after)
	}
	px.restore()
}

// A blackhole (the network drops packets; connections stay open) leaves a
// call without a reply until the handle's own deadline. That is Redis
// unreachable, as a refused connection is: Acquire keeps waiting while its
// context lives and is granted once Redis answers, instead of failing with
// a deadline its caller never set.
func TestAcquireWaitsOutABlackholeLongerThanItsCallsDeadline(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	proxy := testenv.NewProxy(t, "tcp", redisAddr(t))
	c := clientVia(t, proxy.Addr())
	var acquireCalls atomic.Int64
	c.AddHook(&faultHook{before: func(cmd redis.Cmder) {
		if isScript(cmd, semaphore.AcquireScript) {
			acquireCalls.Add(1)
		}
	}})
	s := newSem(t, c, prefix, semaphore.Options{Limit: 1})
	watcher := newSem(t, clientVia(t, redisAddr(t)), prefix, semaphore.Options{Limit: 1})
	p := mustAcquire(t, s) // a warm connection, then the blackhole
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := acquireCalls.Load()
	proxy.Blackhole()
	restored := make(chan time.Time, 1)
	go func() {
		// Past the first call's own deadline: the Acquire has sent another.
		if !testenv.Eventually(30*time.Second, func() bool { return acquireCalls.Load() >= before+2 }) {
			t.Error("the Acquire sent no second call into the blackhole")
		}
		proxy.Restore()
		restored <- time.Now()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := s.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire across a blackhole: %v; want a permit once Redis answers", err)
	}
	select {
	case <-restored:
	default:
		t.Fatal("Acquire returned a permit while Redis was blackholed")
	}
	st, err := watcher.Stats(context.Background())
	if err != nil || st.Held != 1 {
		t.Fatalf("Redis shows %d held (%v); want the one permit Acquire returned", st.Held, err)
	}
	if err := q.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A permit released during an outage longer than its lease is still given
// back once Redis answers. Redis keeps a live process's lapsed permits for
// one more lease when that process calls first (here the refresh of its
// waiter), since the work they guard may still run; a release that stopped
// retrying at the lease's end therefore left the permit taken, guarding
// nothing, for a whole extra lease, and every waiter of the fleet waited
// that long.
func TestAPermitReleasedDuringAnOutagePastItsLeaseIsGivenBackWhenRedisReturns(t *testing.T) {
	t.Parallel()
	const lease = 4 * time.Second
	rdb, prefix := testenv.Redis(t)
	px, pxOther := startProxy(t, redisAddr(t)), startProxy(t, redisAddr(t))
	s := newSem(t, clientVia(t, px.addr()), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, clientVia(t, pxOther.addr()), prefix, semaphore.Options{Limit: 1})
	watch := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	ctx := context.Background()
	released := mustAcquire(t, s)
	got := acquireQueued(t, other, watch, 1)
	acquireQueued(t, s, watch, 2) // s's own waiter, behind it

	// Redis goes away for both processes, past s's lease.
	lapses := deadlineMs(rdb, prefix, "holders", released.ID())
	px.cut()
	pxOther.cut()
	if err := released.Release(ctx); err != nil {
		t.Errorf("Release with Redis away = %v, want nil (retried in the background)", err)
	}
	testenv.WaitFor(t, 3*lease, "the released permit's lease to run out in Redis", func() bool { return redisNowMs(t, rdb) > lapses })
	// s calls first when Redis is back, as a busy worker does: Redis keeps
	// the lapsed permit for it, marked lost, unless the release landed first.
	px.restore()
	testenv.WaitFor(t, 2*lease, "s's first call after the outage", func() bool {
		info, err := rdb.HGet(ctx, prefix+":{db}:info", released.ID()).Result()
		return strings.HasSuffix(info, ":lost") || deadlineMs(rdb, prefix, "holders", released.ID()) == 0 && err == redis.Nil
	})
	pxOther.restore()
	back := time.Now()
	q := receiveGrant(t, got, resumeWithin, "the other process's waiter, after Redis came back")
	t.Logf("the waiter held the permit %v after Redis came back", time.Since(back))
	defer q.Release(ctx)
	for _, h := range stats(t, watch).Holders {
		if h.ID == released.ID() {
			t.Errorf("the released permit is still held in Redis: %+v", stats(t, watch))
		}
	}
}

// TestARedisOutageIsOneWarningAndOneEndLineNotALinePerCall: Redis killed
// for a second or more (and restarted from its AOF) under 40 goroutines that
// acquire and release in a loop: each failed call is counted at debug,
// the handle warns once per cause (unreachable; failing over, if the
// restart is caught loading), and says at info that the outage is over,
// how long it lasted and how many calls failed for it.
func TestARedisOutageIsOneWarningAndOneEndLineNotALinePerCall(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivateRedisServer(t, "--appendonly", "yes", "--appendfsync", "always")
	var logs testenv.LogBuffer
	s := newSem(t, ownClient(t, srv.Client), testenv.Prefix(t), semaphore.Options{Limit: 4,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	const goroutines = 40
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var rounds atomic.Int64
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p, err := s.Acquire(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("Acquire: %v", err)
					}
					return
				}
				time.Sleep(time.Millisecond)        // held a while
				_ = p.Release(context.Background()) // during the outage: retried in the background
				rounds.Add(1)
			}
		}()
	}
	t.Cleanup(func() { stop(); wg.Wait() }) // before Close, should the test fail
	testenv.WaitFor(t, 10*time.Second, "permits going round", func() bool { return rounds.Load() > 100 })
	var warns []string
	var over map[string]any
	debugs, failures := 0, 0 // failures: as the outage's log counts them
	scan := func() {
		warns, over, debugs, failures = nil, nil, 0, 0
		for _, r := range logs.Records(t) {
			msg := fmt.Sprint(r["msg"])
			if strings.HasPrefix(msg, "semaphore: Redis unreachable: retrying") || strings.HasPrefix(msg, "semaphore: failed during an outage") {
				failures++
			}
			switch {
			case r["level"] == "WARN" || r["level"] == "ERROR":
				warns = append(warns, msg)
			case r["level"] == "DEBUG":
				debugs++
			case msg == "semaphore: Redis unreachable: over":
				over = r
			}
		}
	}
	srv.Kill()
	killed := time.Now()
	// Down until the outage has counted a failed call per goroutine, and
	// for a second at least: an outage, not a blip.
	testenv.WaitFor(t, 20*time.Second, "the outage warned of, and a failed call per goroutine", func() bool {
		scan()
		return len(warns) > 0 && failures >= goroutines && debugs >= goroutines && time.Since(killed) > time.Second
	})
	srv.Start()
	down := time.Since(killed)
	before := rounds.Load()
	testenv.WaitFor(t, 20*time.Second, "permits going round again", func() bool { return rounds.Load() > before+100 })
	testenv.Eventually(10*time.Second, func() bool { scan(); return over != nil })
	stop()
	wg.Wait()
	t.Logf("%d warnings, %d debug lines; end: %v", len(warns), debugs, over)
	if len(warns) == 0 || len(warns) > 2 {
		t.Errorf("%d lines at warn through the outage; want one per cause (1 or 2):\n%s", len(warns), strings.Join(warns, "\n"))
	}
	for _, w := range warns {
		if !strings.HasPrefix(w, "semaphore: Redis unreachable") && !strings.HasPrefix(w, "semaphore: Redis failing over") {
			t.Errorf("warning %q is not the outage's", w)
		}
	}
	if debugs < goroutines {
		t.Errorf("%d lines at debug; want at least one per goroutine whose calls failed (%d)", debugs, goroutines)
	}
	if over == nil {
		t.Fatalf("no line within 10s of Redis's return saying the outage is over; the last lines:\n%s", logs.Tail(5))
	}
	if over["level"] != "INFO" || over["semaphore"] != "db" {
		t.Errorf("the outage's end: %v; want an info line of semaphore db", over)
	}
	if lasted, _ := over["lasted"].(float64); time.Duration(lasted) < down/2 {
		t.Errorf("the outage's end says it lasted %v; Redis was down %v", time.Duration(lasted), down)
	}
	if failures, _ := over["failures"].(float64); failures < goroutines {
		t.Errorf("the outage's end counts %v failed calls; want at least one per goroutine (%d)", over["failures"], goroutines)
	}
}
