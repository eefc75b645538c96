package semaphore_test

// Each test here reproduces a bug that a review found (with an injected
// delay or fault where the race needs one) and proves the fix.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// The arguments of EVALSHA and FCALL: the command, the sha or function name,
// numkeys, 11 keys, then ARGV. The token is ARGV[5] of acquire and release;
// acquire's wait flag is ARGV[8].
const (
	numKeys     = 11
	argToken    = 3 + numKeys + 4
	argWaitFlag = 3 + numKeys + 7
)

func isScript(cmd redis.Cmder, id semaphore.ScriptID) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	switch cmd.Name() {
	case "evalsha":
		return args[1] == id.Hash
	case "fcall":
		return args[1] == id.Function
	}
	return false
}

func arg(cmd redis.Cmder, i int) string {
	if args := cmd.Args(); i < len(args) {
		return fmt.Sprint(args[i])
	}
	return ""
}

// faultHook lets a test act on a command after the server has run it (to
// delay its reply, or replace it with an error), or refuse it unsent.
type faultHook struct {
	before func(cmd redis.Cmder) // runs before the command is sent
	after  func(cmd redis.Cmder) // runs once a reply without error is in
	refuse func(cmd redis.Cmder) bool
}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.refuse != nil && h.refuse(cmd) {
			err := errors.New("dial tcp: connection refused (injected)")
			cmd.SetErr(err)
			return err
		}
		if h.before != nil {
			h.before(cmd)
		}
		err := next(ctx, cmd)
		if h.after != nil && err == nil { // a NOSCRIPT miss did not run the script
			h.after(cmd)
			// Inside a hook, next's error is not yet set on cmd: return it
			// (a NOSCRIPT must reach go-redis's EVAL fallback) unless after
			// injected one of its own.
			if injected := cmd.Err(); injected != nil {
				return injected
			}
		}
		return err
	}
}
func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func hookedClient(t *testing.T, h *faultHook) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	c.AddHook(h)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A grant pushed to a process cut off from Redis lapses before the process
// reads it, and another process is granted. When the first process is back,
// the stale wake-up must not hand it a permit: it re-queues instead.
func TestAGrantThatLapsedInTheWakeListIsNeverHandedOver(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	a, other, px := cutOffPair(t, lease, time.Minute)
	ctx := context.Background()
	p := mustAcquire(t, other)
	got := acquireQueued(t, a, other, 1)
	px.cut()
	if err := p.Release(ctx); err != nil { // grants a's waiter; the wake-up waits in a's list
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a's unrefreshed grant to lapse", func() bool { return stats(t, other).Held == 0 })
	q := mustAcquire(t, other)
	px.restore()
	select {
	case r := <-got:
		t.Fatalf("a was handed permit %s while %s holds the only one: %+v", r.ID(), q.ID(), stats(t, other))
	case <-time.After(2 * lease):
	}
	if st := stats(t, other); len(st.Waiters) != 1 {
		t.Fatalf("a did not re-queue: %+v", st)
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != r.ID() {
		t.Errorf("a's permit is not the one Redis holds: %+v", st)
	}
	_ = r.Release(ctx)
}

// lostAcquireReply returns a hook that holds back the reply of the first
// acquire call that match accepts until release is called, and then loses
// it (an i/o timeout after the script ran), and that release.
func lostAcquireReply(match func(cmd redis.Cmder) bool) (*faultHook, func()) {
	unblock := make(chan struct{})
	var once sync.Once
	var lost atomic.Bool
	h := &faultHook{after: func(cmd redis.Cmder) {
		if isScript(cmd, semaphore.AcquireScript) && match(cmd) && lost.CompareAndSwap(false, true) {
			<-unblock
			cmd.SetErr(errors.New("read tcp: i/o timeout (injected)"))
		}
	}}
	return h, func() { once.Do(func() { close(unblock) }) }
}

// A waiter's first acquire call queues it, but its reply is lost (the
// process is cut off). Before the retry, its place is granted (the wake-up
// waits in its list, unread: the process has no dispatcher yet), the grant
// lapses, and another process takes the only permit. The retry must not
// queue again under the same token: the stale wake-up would then pass for
// the new place's grant and hand the process a permit Redis never gave it.
// (This is how TestAGrantThatLapsedInTheWakeListIsNeverHandedOver failed
// under load, when the cut lost the queued reply.)
func TestARetriedAcquireIsNeverHandedTheGrantOfItsLapsedPlace(t *testing.T) {
	t.Parallel()
	h, release := lostAcquireReply(func(cmd redis.Cmder) bool { return arg(cmd, argWaitFlag) == "1" })
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	a := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	t.Cleanup(release) // before a's Close, should the test stop early
	ctx := context.Background()
	p := mustAcquire(t, other)
	got := acquireQueued(t, a, other, 1) // queued in Redis; a has not read the reply
	first := stats(t, other).Waiters[0].ID
	if err := p.Release(ctx); err != nil { // grants a's place; the wake-up waits unread
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a's unrefreshed grant to lapse", func() bool { return stats(t, other).Held == 0 })
	q := mustAcquire(t, other)
	release() // the reply is lost: a retries
	testenv.WaitFor(t, 5*time.Second, "a to queue again", func() bool { return len(stats(t, other).Waiters) == 1 })
	select {
	case r := <-got:
		t.Fatalf("a was handed permit %s (fence %d) while %s holds the only one: %+v", r.ID(), r.Fence(), q.ID(), stats(t, other))
	case <-time.After(2 * lease):
	}
	st := stats(t, other)
	if len(st.Waiters) != 1 || st.Waiters[0].ID == first {
		t.Fatalf("a did not queue again under a new token (the first was %s): %+v", first, st)
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := receiveGrant(t, got, 5*time.Second, "a's new place, once q is released")
	if st := stats(t, other); len(st.Holders) != 1 || st.Holders[0].ID != r.ID() {
		t.Errorf("a's permit is not the one Redis holds: %+v", st)
	}
	_ = r.Release(ctx)
}

// A waiter's "queued" reply is slow; meanwhile the releasing handle hands
// it the permit in-process. Its lease must be dated from its enqueue, not
// from the zero time: a live permit must not be cancelled.
func TestALocalGrantBeforeTheQueuedReplyKeepsItsLease(t *testing.T) {
	t.Parallel()
	var slow atomic.Bool
	released := make(chan struct{})
	h := &faultHook{after: func(cmd redis.Cmder) {
		if slow.Load() && isScript(cmd, semaphore.AcquireScript) && arg(cmd, argWaitFlag) == "1" {
			select { // the reply comes once the release has handed over
			case <-released:
			case <-time.After(10 * time.Second):
			}
		}
	}}
	_, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	s := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	ctx := context.Background()
	a := mustAcquire(t, s)
	slow.Store(true)
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := s.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	testenv.WaitFor(t, 5*time.Second, "b queued", func() bool { return len(stats(t, s).Waiters) == 1 })
	if err := a.Release(ctx); err != nil { // hands b its permit before b's reply is read
		t.Fatal(err)
	}
	close(released)
	b := <-got
	select {
	case <-b.Context().Done():
		t.Fatalf("a live permit was cancelled: %v; Redis: %+v", context.Cause(b.Context()), stats(t, s))
	case <-time.After(2 * lease):
	}
	if err := b.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// The first acquire call is granted but its reply is lost; the retry, once
// most of the grant's lease has run out in Redis, finds the grant. The
// lease must be re-armed from the retry, so that the local view never
// outlives Redis's.
func TestARetriedAcquireDatesItsLeaseFromTheRetry(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	var lostOnce, cutOff atomic.Bool
	h := &faultHook{
		after: func(cmd redis.Cmder) {
			if isScript(cmd, semaphore.AcquireScript) && lostOnce.CompareAndSwap(false, true) {
				tok := arg(cmd, argToken)
				if !testenv.Eventually(5*time.Second, func() bool { return leaseLeftMs(rdb, prefix, tok) < float64(lease.Milliseconds())/4 }) {
					t.Error("the first grant's lease did not run down in Redis")
				}
				cmd.SetErr(errors.New("read tcp: i/o timeout (injected)"))
			}
		},
		refuse: func(cmd redis.Cmder) bool { return cutOff.Load() && isScript(cmd, semaphore.RefreshScript) },
	}
	s := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	ctx := context.Background()
	p := mustAcquire(t, s)
	cutOff.Store(true) // p's refreshes fail from now on
	q := mustAcquire(t, other)
	defer q.Release(ctx)
	if p.Context().Err() == nil {
		t.Errorf("another process was granted while p's context was still live")
	}
}

// A grant reaches a waiter (through the watchdog) and then its own acquire
// call fails for good: the permit must be given back, not kept alive by the
// watchdog forever.
func TestAnAcquireThatFailsAfterItsGrantLeavesNothingHeld(t *testing.T) {
	t.Parallel()
	unblock := make(chan struct{})
	var target atomic.Value
	target.Store("")
	var targetRefreshed atomic.Int64 // refreshes of the target's permit
	h := &faultHook{
		before: func(cmd redis.Cmder) {
			if isScript(cmd, semaphore.RefreshScript) && slices.ContainsFunc(cmd.Args(), func(a any) bool { return a == target.Load() }) {
				targetRefreshed.Add(1)
			}
		},
		after: func(cmd redis.Cmder) {
			if isScript(cmd, semaphore.AcquireScript) && arg(cmd, argToken) == target.Load() {
				<-unblock
				cmd.SetErr(errors.New("ERR injected permanent error"))
			}
		},
		// The give-back fails too, so only not refreshing the permit can
		// return it: the watchdog must have forgotten it.
		refuse: func(cmd redis.Cmder) bool {
			return isScript(cmd, semaphore.ReleaseScript) && arg(cmd, argToken) == target.Load()
		},
	}
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	s := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	ctx := context.Background()
	p0, err := s.Acquire(ctx) // starts s's watchdog
	if err != nil {
		t.Fatal(err)
	}
	_ = p0.Release(ctx)
	p := mustAcquire(t, other)
	// The next token s hands out is sequence 2 of weight 1.
	target.Store(p0.ID()[:len(p0.ID())-len("1:1")] + "2:1")
	failed := make(chan error, 1)
	go func() { _, err := s.Acquire(ctx); failed <- err }()
	testenv.WaitFor(t, 5*time.Second, "s queued", func() bool { return len(stats(t, other).Waiters) == 1 })
	_ = p.Release(ctx) // grants s's waiter
	// s has the grant (its waiter's acquire call has not answered, so
	// only a permit's token is refreshed).
	testenv.WaitFor(t, 5*time.Second, "s to refresh the granted permit", func() bool { return targetRefreshed.Load() > 0 })
	close(unblock)
	if err := <-failed; err == nil {
		t.Fatal("Acquire succeeded despite the injected error")
	}
	testenv.WaitFor(t, 5*lease, "the orphaned grant to be given back", func() bool { return stats(t, other).Held == 0 })
}

func TestAcquireOnAClosedClientFailsAtOnce(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	opt, _ := redis.ParseURL(testenv.RedisURL(t))
	c := redis.NewClient(opt)
	s, err := semaphore.New(c, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = c.Close()
	done := make(chan error, 1)
	go func() { _, err := s.Acquire(context.Background()); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, redis.ErrClosed) {
			t.Errorf("Acquire on a closed client = %v, want redis.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire on a closed client kept retrying")
	}
}

func TestCloseEndsAnAcquireRetryingAgainstUnreachableRedis(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	px := startProxy(t, redisAddr(t))
	px.cut()
	s := newSem(t, clientVia(t, px.addr()), prefix, semaphore.Options{Limit: 1})
	done := make(chan error, 1)
	go func() { _, err := s.Acquire(context.Background()); done <- err }()
	testenv.WaitFor(t, 5*time.Second, "the Acquire retrying", func() bool { return px.refused.Load() >= 2 })
	go func() { _ = s.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, semaphore.ErrClosed) {
			t.Errorf("Acquire after Close = %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Acquire kept retrying after Close")
	}
}

func TestReleaseWithThePermitsOwnContextGivesItBack(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	p := mustAcquire(t, s)
	if err := p.Release(p.Context()); err != nil {
		t.Errorf("Release(p.Context()) = %v", err)
	}
	if st := stats(t, s); st.Held != 0 {
		t.Errorf("Redis still holds %d after Release(p.Context())", st.Held)
	}
	// And with a context cancelled before Release.
	ctx, cancel := context.WithCancel(context.Background())
	q, err := s.Acquire(ctx) // the permit's context descends from ctx
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := q.Release(ctx); err != nil {
		t.Errorf("Release with a cancelled context = %v", err)
	}
	if st := stats(t, s); st.Held != 0 {
		t.Errorf("Redis still holds %d after Release with a cancelled context", st.Held)
	}
}

func TestReleaseRacingCloseNeverReportsALostLease(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	counts := map[string]int{}
	for i := 0; i < 1000; i++ {
		s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		p := mustAcquire(t, s)
		var wg sync.WaitGroup
		var rerr error
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; rerr = p.Release(context.Background()) }()
		go func() {
			defer wg.Done()
			<-start
			for j := 0; j < i%50; j++ { // vary who goes first
				runtime.Gosched()
			}
			_ = s.Close()
		}()
		close(start)
		wg.Wait()
		switch {
		case rerr == nil:
			counts["nil"]++
		case errors.Is(rerr, semaphore.ErrClosed):
			counts["closed"]++
		default:
			t.Fatalf("Release racing Close = %v, want nil or ErrClosed", rerr)
		}
		if st := stats(t, s); st.Held != 0 {
			t.Fatalf("after Release racing Close, Redis holds %+v", st.Holders)
		}
	}
	t.Logf("Release racing Close: %v", counts)
}

func TestSetLimitFailsHeavyWaitersAnywhereInTheQueue(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 4, Lease: time.Minute})
	ctx := context.Background()
	p, err := s.AcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)
	light := make(chan error, 1)
	go func() {
		q, err := s.AcquireN(ctx, 2) // at the head; fits under the new limit
		if err == nil {
			err = q.Release(ctx)
		}
		light <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the light waiter", func() bool { return len(stats(t, s).Waiters) == 1 })
	heavy := make(chan error, 1)
	go func() { _, err := s.AcquireN(ctx, 4); heavy <- err }()
	testenv.WaitFor(t, 5*time.Second, "the heavy waiter", func() bool { return len(stats(t, s).Waiters) == 2 })
	if err := s.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-heavy:
		if !errors.Is(err, semaphore.ErrExceedsLimit) {
			t.Errorf("heavy waiter = %v, want ErrExceedsLimit", err)
		}
	case <-time.After(time.Second):
		t.Fatalf("the heavy waiter behind the head was not failed: %+v", stats(t, s).Waiters)
	}
	if st := stats(t, s); len(st.Waiters) != 1 {
		t.Errorf("waiters after SetLimit = %+v, want only the light one", st.Waiters)
	}
	_ = p.Release(ctx)
	if err := <-light; err != nil {
		t.Error(err)
	}
}

func TestStatsListsHoldersInGrantOrder(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 20, Lease: 300 * time.Millisecond})
	ctx := context.Background()
	for i := 0; i < 12; i++ {
		p := mustAcquire(t, s)
		defer p.Release(ctx)
	}
	// A refresh: all lease deadlines now equal.
	testenv.WaitFor(t, 5*time.Second, "one refresh of all the leases", func() bool {
		deadlines, err := rdb.ZRangeWithScores(ctx, prefix+":{db}:holders", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(deadlines) == 12 && deadlines[0].Score == deadlines[11].Score
	})
	st := stats(t, s)
	if len(st.Holders) != 12 {
		t.Fatalf("%d holders, want 12", len(st.Holders))
	}
	for i := 1; i < len(st.Holders); i++ {
		if st.Holders[i].Fence <= st.Holders[i-1].Fence {
			t.Fatalf("holder with fence %d listed after fence %d", st.Holders[i].Fence, st.Holders[i-1].Fence)
		}
	}
}

// Contended, with some holds spanning refresh ticks and hand-offs both
// in-process and across handles: with Redis healthy, no lease is ever lost.
func TestHoldersOfAHealthySemaphoreNeverLoseTheirLease(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const lease = 300 * time.Millisecond
	sems := []*semaphore.Semaphore{
		newSem(t, rdb, prefix, semaphore.Options{Limit: 2, Lease: lease}),
		newSem(t, rdb, prefix, semaphore.Options{Limit: 2, Lease: lease}),
	}
	ctx := context.Background()
	var lost, released atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				p, err := sems[g%2].Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if i%30 == 0 { // held until a refresh of it
					from := deadlineMs(rdb, prefix, "holders", p.ID())
					if !testenv.Eventually(10*lease, func() bool { return deadlineMs(rdb, prefix, "holders", p.ID()) > from }) {
						t.Errorf("permit %s not refreshed within %v", p.ID(), 10*lease)
					}
				} else {
					time.Sleep(time.Millisecond) // held a while
				}
				err = p.Release(ctx)
				switch {
				case errors.Is(err, semaphore.ErrLeaseLost):
					lost.Add(1)
				case err != nil:
					t.Error(err)
				default:
					released.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if lost.Load() > 0 || released.Load() != 600 {
		t.Errorf("%d leases lost, %d released of 600, with Redis healthy", lost.Load(), released.Load())
	}
}

// A waiter is registered before its first acquire call; a refresh that
// reaches Redis before that call must not call the token unknown and
// re-queue the waiter under a new token, leaving the first grant orphaned.
func TestARefreshBeforeTheFirstAcquireCallDoesNotRequeue(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	var target atomic.Value
	target.Store("")
	var refreshes atomic.Int64
	h := &faultHook{
		before: func(cmd redis.Cmder) {
			if isScript(cmd, semaphore.AcquireScript) && arg(cmd, argToken) == target.Load() {
				// A watchdog refresh is sent, and answered, meanwhile.
				n := refreshes.Load()
				if !testenv.Eventually(10*lease, func() bool { return refreshes.Load() >= n+2 }) {
					t.Error("no watchdog refresh while the first acquire call waited")
				}
			}
		},
		after: func(cmd redis.Cmder) {
			if isScript(cmd, semaphore.RefreshScript) {
				refreshes.Add(1)
			}
		},
	}
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 2, Lease: lease})
	observer := newSem(t, rdb, prefix, semaphore.Options{Limit: 2, Lease: time.Minute})
	keep := mustAcquire(t, s) // keeps s's watchdog running
	defer keep.Release(context.Background())
	target.Store(keep.ID()[:len(keep.ID())-len("1:1")] + "2:1")
	p := mustAcquire(t, s)
	if st := stats(t, observer); st.Held != 2 || len(st.Holders) != 2 {
		t.Fatalf("after two grants Redis shows %+v", st)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// An orphan would be kept alive by the watchdog's refreshes, while
	// Redis lets lapse what nobody refreshes.
	kept := deadlineMs(rdb, prefix, "holders", keep.ID())
	testenv.WaitFor(t, 10*lease, "a lease past the release, refreshed", func() bool {
		return deadlineMs(rdb, prefix, "holders", keep.ID()) > kept+float64(lease.Milliseconds())
	})
	if st := stats(t, observer); st.Held != 1 || len(st.Waiters) != 0 {
		t.Errorf("after releasing p, Redis shows %+v: a grant was orphaned", st)
	}
}

// The reply to an acquire that was granted at once arrives after the lease
// could have run out (the process stalled). The grant is not handed over
// as is; the watchdog — started for it if need be — settles it, and Acquire
// returns a permit Redis holds rather than waiting forever.
func TestAGrantWhoseReplyCameTooLateIsSettledNotStuck(t *testing.T) {
	t.Parallel()
	const lease = time.Second // its watchdog refreshes in time on a loaded machine too
	rdb, prefix := testenv.Redis(t)
	var stall atomic.Bool
	stall.Store(true)
	h := &faultHook{after: func(cmd redis.Cmder) {
		if isScript(cmd, semaphore.AcquireScript) && stall.CompareAndSwap(true, false) {
			// The reply comes once the grant's lease has run out in Redis.
			tok := arg(cmd, argToken)
			if !testenv.Eventually(10*lease, func() bool { return leaseLeftMs(rdb, prefix, tok) <= 0 }) {
				t.Error("the grant's lease did not run out in Redis")
			}
		}
	}}
	s := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	observer := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := s.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	select {
	case p := <-got:
		if p == nil {
			t.Fatal("Acquire failed")
		}
		if st := stats(t, observer); len(st.Holders) != 1 || st.Holders[0].ID != p.ID() {
			t.Errorf("Acquire returned %s but Redis shows %+v", p.ID(), st)
		}
		_ = p.Release(context.Background())
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire is stuck on a grant whose reply came after its lease")
	}
}

// The dispatcher's blocking connection must not share the client's options
// with a second lock. go-redis's Client.Conn does: in the default
// maintenance-notifications mode ("auto") every new connection whose
// handshake the server refuses (Redis before 8) writes the mode back into
// the options under its own client's lock, so the dispatcher's connection,
// dialled while the client's first connections are still in their
// handshakes, raced with them. Under -race this failed about one run in
// five of the whole package; here the window is opened on purpose: fresh
// clients, many first Acquires at once.
func TestTheDispatchersConnectionDoesNotRaceTheClientsHandshakes(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 10; round++ {
		rdb := redis.NewClient(opt)
		s, err := semaphore.New(rdb, "db", semaphore.Options{Prefix: prefix, Limit: 64})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := s.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				_ = p.Release(context.Background())
			}()
		}
		wg.Wait()
		_ = s.Close()
		_ = rdb.Close()
	}
}

// waitLapsed waits until each permit's lease has run out in Redis while it
// is still listed in holders (the semaphore's holders key). It reads the
// key directly: any script would purge them.
func waitLapsed(t *testing.T, rdb *redis.Client, holders string, tokens ...string) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, 10*time.Second, "the permits' leases to run out in Redis", func() bool {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range tokens {
			deadline, err := rdb.ZScore(ctx, holders, tok).Result()
			if err != nil || int64(deadline) >= now.UnixMilli() {
				return false
			}
		}
		return true
	})
}

// A process whose permits' leases ran out in Redis while nobody else called
// (it was paused, or cut off) gives them back one by one, each once the
// work it guards has stopped — a query gone from the database. Releasing
// the first must not hand the others' capacity to waiters with it: each
// goes on only at its own release, or, should that never come, a lease
// later. (pgsource's TestAResumedHoldersLostPermitsReachWaitersOnlyOnceItsQueriesEnded
// saw a fourth query beside three permits when the first release purged
// all three.)
func TestAReleaseDoesNotHandOnTheReleasersOtherLapsedPermits(t *testing.T) {
	t.Parallel()
	var cutOff atomic.Bool
	h := &faultHook{refuse: func(cmd redis.Cmder) bool { return cutOff.Load() && isScript(cmd, semaphore.RefreshScript) }}
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	a := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 2, Lease: lease})
	// The waiters' handle refreshes every 20s: no call of theirs purges.
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 2, Lease: time.Minute})
	ctx := context.Background()
	p1, p2 := mustAcquire(t, a), mustAcquire(t, a)
	got1 := acquireQueued(t, other, other, 1)
	got2 := acquireQueued(t, other, other, 2)
	cutOff.Store(true) // a's refreshes fail from now on
	holders, queue := prefix+":{db}:holders", prefix+":{db}:queue"
	waitLapsed(t, rdb, holders, p1.ID(), p2.ID())
	if err := p1.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Errorf("p1.Release = %v, want ErrLeaseLost", err)
	}
	if n := rdb.ZCard(ctx, queue).Val(); n != 1 {
		t.Fatalf("releasing p1 granted %d waiters, want 1: p2's capacity went with it while its work may still run", 2-n)
	}
	if rdb.ZScore(ctx, holders, p2.ID()).Err() != nil {
		t.Fatalf("p2 is no longer held in Redis after p1's release")
	}
	q1 := receiveGrant(t, got1, 5*time.Second, "p1's capacity")
	defer q1.Release(ctx)
	// p2 is never released: its capacity still returns, a lease later.
	testenv.WaitFor(t, 10*time.Second, "p2's capacity to reach the second waiter", func() bool { return len(stats(t, other).Waiters) == 0 })
	q2 := receiveGrant(t, got2, 5*time.Second, "p2's capacity")
	defer q2.Release(ctx)
	if cause := context.Cause(p2.Context()); !errors.Is(cause, semaphore.ErrLeaseLost) {
		t.Errorf("p2's context: %v, want ErrLeaseLost", cause)
	}
	if err := p2.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Errorf("p2.Release = %v, want ErrLeaseLost", err)
	}
}

// As above, when the first call of the resumed process is its watchdog's
// refresh (it also waits for a permit): the refresh must not hand its lapsed
// permits on either, though it no longer lists them.
func TestARefreshDoesNotHandOnItsProcesssLapsedPermits(t *testing.T) {
	t.Parallel()
	var cutOff atomic.Bool
	h := &faultHook{refuse: func(cmd redis.Cmder) bool { return cutOff.Load() && isScript(cmd, semaphore.RefreshScript) }}
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	a := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 2, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 2, Lease: time.Minute})
	ctx := context.Background()
	p1, p2 := mustAcquire(t, a), mustAcquire(t, a)
	_ = acquireQueued(t, other, other, 1)
	_ = acquireQueued(t, a, other, 2) // a waits too: its refresh has a token to send
	st := stats(t, other)
	first, waiting := st.Waiters[0].ID, st.Waiters[1].ID
	cutOff.Store(true)
	holders, queue, alive := prefix+":{db}:holders", prefix+":{db}:queue", prefix+":{db}:alive"
	waitLapsed(t, rdb, holders, p1.ID(), p2.ID())
	before := rdb.ZScore(ctx, alive, waiting).Val()
	cutOff.Store(false) // a's watchdog retries within a second
	testenv.WaitFor(t, 5*time.Second, "a's refresh", func() bool {
		hb, err := rdb.ZScore(ctx, alive, waiting).Result()
		return err != nil || hb != before // refreshed, or dropped (its heartbeat lapsed too)
	})
	if rdb.ZScore(ctx, queue, first).Err() != nil {
		t.Fatalf("a's refresh granted the waiter at the head while a's lapsed permits were not released")
	}
	for _, p := range []*semaphore.Permit{p1, p2} {
		if rdb.ZScore(ctx, holders, p.ID()).Err() != nil {
			t.Fatalf("a's refresh purged %s before a released it", p.ID())
		}
	}
	for _, p := range []*semaphore.Permit{p1, p2} {
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
			t.Errorf("Release = %v, want ErrLeaseLost", err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the head granted once a released", func() bool { return rdb.ZScore(ctx, queue, first).Err() != nil })
}

// A holder whose lease Redis let run out while its process went on
// refreshing — Redis's clock jumped ahead, or someone moved the deadline by
// hand — is kept for its process, marked lost (purge_holders), like any
// lapsed permit of a live process. The watchdog's refresh must then tell
// the holder its lease was lost (S4: its context is cancelled, so its
// query stops) instead of extending a lease that Release would later call
// lost; and the permit must stay taken until that Release, or one more
// Lease, not for as long as the process lives.
func TestARefreshTellsAHolderRedisMarkedLostThatItsLeaseIsLost(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const lease = 1500 * time.Millisecond // a refresh every 500ms
	a := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	ctx := context.Background()
	p := mustAcquire(t, a)
	got := acquireQueued(t, other, other, 1)
	holders := prefix + ":{db}:holders"
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// As Redis's clock jumping a lease ahead would leave it.
	if err := rdb.ZAddXX(ctx, holders, redis.Z{Score: float64(now.UnixMilli() - 1), Member: p.ID()}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Context().Done():
	case <-time.After(3 * lease):
		t.Fatalf("the holder's context is still live %v after Redis let its lease run out: the refreshes went on extending it", 3*lease)
	}
	if cause := context.Cause(p.Context()); !errors.Is(cause, semaphore.ErrLeaseLost) {
		t.Fatalf("the holder's context ended with %v, want ErrLeaseLost", cause)
	}
	// Its query may still be stopping: the permit is not handed on yet.
	if err := rdb.ZScore(ctx, holders, p.ID()).Err(); err != nil {
		t.Fatalf("the lost permit left Redis before its process released it: %v", err)
	}
	select {
	case q := <-got:
		q.Release(ctx)
		t.Fatal("the waiter was granted the lost permit before its process released it")
	default:
	}
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Errorf("Release = %v, want ErrLeaseLost", err)
	}
	q := receiveGrant(t, got, 5*time.Second, "the lost permit, once released")
	defer q.Release(ctx)
}

// An acquire granted at once loses its reply, and the permit lapses in
// Redis before the retry. The retry's own purge keeps the lapsed permit
// for its process, marked lost: the retry must not hand it over as a live
// permit (its lease was lost, and the watchdog would cancel it at its next
// refresh), but ask again under a new token, as for a lapsed place.
func TestARetriedAcquireIsNeverHandedItsLapsedPermit(t *testing.T) {
	t.Parallel()
	h, release := lostAcquireReply(func(redis.Cmder) bool { return true })
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	a := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	t.Cleanup(release)
	ctx := context.Background()
	got := acquireAsync(ctx, a, 1)
	var first string
	testenv.WaitFor(t, 5*time.Second, "a's first call to be granted", func() bool {
		if st := stats(t, other); len(st.Holders) == 1 {
			first = st.Holders[0].ID
		}
		return first != ""
	})
	holders := prefix + ":{db}:holders"
	waitLapsed(t, rdb, holders, first)
	release() // the reply is lost: a retries
	r := expectGrant(t, got, "a's Acquire, after its retry")
	if r.ID() == first {
		t.Fatalf("the retry handed over the lapsed permit %s, which Redis keeps marked lost", first)
	}
	// Over two refreshes the new permit stays live.
	select {
	case <-r.Context().Done():
		t.Fatalf("the permit's context ended: %v", context.Cause(r.Context()))
	case <-time.After(2 * lease / 3 * 2):
	}
	if err := r.Release(ctx); err != nil {
		t.Errorf("Release = %v, want nil", err)
	}
	testenv.WaitFor(t, 5*time.Second, "nothing held", func() bool { return stats(t, other).Held == 0 })
}

// As above, but the grant came by the wake list while the acquire call was
// being retried: the dispatcher handed it over (its lease was running
// then), the process could not refresh it, and it lapsed before the retry
// reached Redis, which answers that the token's permit lapsed. The permit
// handed over must not be returned: Redis no longer counts it for this
// process, and the waiter, asking again under a new token, would leave
// that token's grant to nobody, held and refreshed until Close.
func TestARetriedAcquireDropsTheGrantThatLapsedWhileItRetried(t *testing.T) {
	t.Parallel()
	var armed, cutOff atomic.Bool
	h, release := lostAcquireReply(func(cmd redis.Cmder) bool { return armed.Load() && arg(cmd, argWaitFlag) == "1" })
	h.refuse = func(cmd redis.Cmder) bool { return cutOff.Load() && isScript(cmd, semaphore.RefreshScript) }
	rdb, prefix := testenv.Redis(t)
	const lease = 600 * time.Millisecond
	a := newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	t.Cleanup(release)
	ctx := context.Background()
	// a's dispatcher runs from its first grant on.
	if err := mustAcquire(t, a).Release(ctx); err != nil {
		t.Fatal(err)
	}
	p := mustAcquire(t, other)
	armed.Store(true)
	got := acquireAsync(ctx, a, 1)
	var first string
	testenv.WaitFor(t, 5*time.Second, "a to queue", func() bool {
		st := stats(t, other)
		if len(st.Waiters) == 1 {
			first = st.Waiters[0].ID
		}
		return first != ""
	})
	cutOff.Store(true)                     // a cannot refresh the grant it is about to get
	if err := p.Release(ctx); err != nil { // grants a's place; a's dispatcher hands it over
		t.Fatal(err)
	}
	holders := prefix + ":{db}:holders"
	waitLapsed(t, rdb, holders, first)
	cutOff.Store(false)
	release() // the queued reply is lost: a retries
	r := expectGrant(t, got, "a's Acquire, after its retry")
	if r.ID() == first {
		t.Fatalf("Acquire returned the grant %s that lapsed while its call was retried", first)
	}
	if err := r.Release(ctx); err != nil {
		t.Errorf("Release = %v, want nil", err)
	}
	testenv.WaitFor(t, 5*time.Second, "nothing held or waiting", func() bool {
		st := stats(t, other)
		return st.Held == 0 && len(st.Waiters) == 0
	})
}
