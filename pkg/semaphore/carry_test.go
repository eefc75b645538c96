package semaphore_test

// Carried enqueues (enqueue.go): a waiter that arrives behind another of
// its process while a release of that process is in flight goes with the
// next release, or with the others that arrived meanwhile in one call once
// the release has returned.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// isCarry reports whether cmd is a release that carries waiters. (Run by
// EVALSHA, a carrying release is the release script itself.)
func isCarry(cmd redis.Cmder) bool {
	return (isScript(cmd, semaphore.CarryScript) || isScript(cmd, semaphore.ReleaseScript)) && len(cmd.Args()) > argToken+5
}

// carryScene is a handle whose script calls a test watches and can hold
// back, with an observer on the same semaphore.
type carryScene struct {
	a, obs *semaphore.Semaphore

	mu       sync.Mutex
	acquires int             // acquire.lua calls
	carries  [][]string      // the waiters each carrying call carried
	carriers []string        // the token each carrying call released ("" for none)
	carried  int             // carrying calls that returned without error
	sent     map[string]bool // tokens Redis heard of: acquire calls, carried waiters
	released []string        // tokens of release calls (not "")

	blockRelease atomic.Value  // string: a release of this token waits for gate
	blockCarry   atomic.Bool   // carrying calls wait for gate
	gate         chan struct{} // guarded by mu: see wait and open
	held         chan string   // receives the token of a call held at the gate
	failCarry    func(cmd redis.Cmder) bool
	loseCarry    atomic.Bool // a carrying call runs, and its reply is lost
}

func newCarryScene(t *testing.T, limit int) *carryScene {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return newCarrySceneOn(t, rdb, prefix, semaphore.Options{Limit: limit})
}

// newCarrySceneOn is newCarryScene on a Redis and with options of the
// test's choosing.
func newCarrySceneOn(t *testing.T, rdb *redis.Client, prefix string, opts semaphore.Options) *carryScene {
	t.Helper()
	c := &carryScene{gate: make(chan struct{}), held: make(chan string, 8), sent: map[string]bool{}}
	c.blockRelease.Store("")
	h := &faultHook{
		refuse: func(cmd redis.Cmder) bool {
			return c.failCarry != nil && isCarry(cmd) && c.failCarry(cmd)
		},
		before: func(cmd redis.Cmder) {
			switch {
			case isScript(cmd, semaphore.AcquireScript):
				c.mu.Lock()
				c.acquires++
				c.sent[arg(cmd, argToken)] = true
				c.mu.Unlock()
			case isCarry(cmd):
				args := cmd.Args()
				var toks []string
				for _, a := range args[argToken+5:] {
					toks = append(toks, fmt.Sprint(a))
				}
				c.mu.Lock()
				c.carries = append(c.carries, toks)
				c.carriers = append(c.carriers, arg(cmd, argToken))
				for _, tok := range toks {
					c.sent[tok] = true
				}
				c.mu.Unlock()
				if c.blockCarry.Load() {
					c.wait("")
				}
			case isScript(cmd, semaphore.ReleaseScript):
				if tok := arg(cmd, argToken); tok != "" {
					c.mu.Lock()
					c.released = append(c.released, tok)
					c.mu.Unlock()
				}
				if tok := c.blockRelease.Load().(string); tok != "" && arg(cmd, argToken) == tok {
					c.wait(tok)
				}
			}
		},
		after: func(cmd redis.Cmder) {
			if isCarry(cmd) {
				c.mu.Lock()
				c.carried++
				c.mu.Unlock()
			}
			if c.loseCarry.Load() && isCarry(cmd) {
				cmd.SetErr(errors.New("read tcp: i/o timeout (injected: the reply was lost)"))
			}
		},
	}
	hooked := redis.NewClient(rdb.Options())
	hooked.AddHook(h)
	t.Cleanup(func() { _ = hooked.Close() })
	c.a = newSem(t, hooked, prefix, opts)
	c.obs = newSem(t, rdb, prefix, semaphore.Options{Limit: opts.Limit})
	return c
}

// wait holds a call at the gate until the test opens it.
func (c *carryScene) wait(tok string) {
	c.mu.Lock()
	gate := c.gate
	c.mu.Unlock()
	c.held <- tok
	<-gate
}

// open lets the calls held at the gate through; later ones wait at a new
// gate.
func (c *carryScene) open() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.gate)
	c.gate = make(chan struct{})
}

func (c *carryScene) snapshot() (acquires int, carries [][]string, carriers []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acquires, slices.Clone(c.carries), slices.Clone(c.carriers)
}

// releaseHeld starts releasing p and returns once its call is held at the
// gate: a release in flight. done receives Release's error.
func (c *carryScene) releaseHeld(t *testing.T, p *semaphore.Permit) (done <-chan error) {
	t.Helper()
	c.blockRelease.Store(p.ID())
	ch := make(chan error, 1)
	go func() { ch <- p.Release(context.Background()) }()
	select {
	case <-c.held:
	case <-time.After(5 * time.Second):
		t.Fatal("the release never reached Redis")
	}
	return ch
}

// oneQueuedBehindARelease is the common scene: c.a held the only permit,
// a waiter of c.a queued behind it (got1 receives its grant), and the
// release of that permit is now held at the gate, in flight; released
// receives Release's error once the gate opens.
func (c *carryScene) oneQueuedBehindARelease(t *testing.T) (got1 <-chan *semaphore.Permit, released <-chan error) {
	t.Helper()
	p := mustAcquire(t, c.a)
	got1 = acquireQueued(t, c.a, c.obs, 1)
	return got1, c.releaseHeld(t, p)
}

// letThrough opens the gate to a held release and waits for it to succeed.
func (c *carryScene) letThrough(t *testing.T, released <-chan error) {
	t.Helper()
	c.open()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
}

// expectEmpty fails the test unless nobody holds or waits on s.
func expectEmpty(t *testing.T, s *semaphore.Semaphore, when string) {
	t.Helper()
	if st := stats(t, s); st.Held != 0 || len(st.Waiters) != 0 {
		t.Fatalf("%s: held %d, waiters %v; want none", when, st.Held, st.Waiters)
	}
}

// acquirePending starts an Acquire on c.a that must wait for a carrier,
// and returns once it does. got receives its permit or its error.
func (c *carryScene) acquirePending(t *testing.T, ctx context.Context, n int) (got <-chan acquired) {
	t.Helper()
	before := c.a.Pending()
	got = acquireAsync(ctx, c.a, n)
	testenv.WaitFor(t, 5*time.Second, "a waiter pending", func() bool { return c.a.Pending() == before+1 })
	return got
}

// acquireAsync calls s.AcquireN(ctx, n) in a goroutine; got receives its
// permit or its error.
func acquireAsync(ctx context.Context, s *semaphore.Semaphore, n int) (got <-chan acquired) {
	ch := make(chan acquired, 1)
	go func() {
		p, err := s.AcquireN(ctx, n)
		ch <- acquired{p, err}
	}()
	return ch
}

type acquired struct {
	p   *semaphore.Permit
	err error
}

func waiterIDs(t *testing.T, s *semaphore.Semaphore) []string {
	t.Helper()
	var ids []string
	for _, w := range stats(t, s).Waiters {
		ids = append(ids, w.ID)
	}
	return ids
}

func expectGrant(t *testing.T, got <-chan acquired, what string) *semaphore.Permit {
	t.Helper()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.p
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no grant within 5s", what)
		return nil
	}
}

func expectNothingYet(t *testing.T, got <-chan acquired, what string) {
	t.Helper()
	select {
	case r := <-got:
		t.Fatalf("%s: got %v, %v; want it still waiting", what, r.p, r.err)
	case <-time.After(100 * time.Millisecond):
	}
}

// Two waiters that arrive while a release is in flight go in one call once
// it returns, in the order they arrived, and are granted in that order.
func TestWaitersArrivingDuringAReleaseGoInOneCallInOrder(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 1)
	ctx := context.Background()
	got1, released := c.oneQueuedBehindARelease(t)
	acquiresBefore, _, _ := c.snapshot()

	got2 := c.acquirePending(t, ctx, 1)
	got3 := c.acquirePending(t, ctx, 1)
	c.letThrough(t, released)
	q1 := receiveGrant(t, got1, 5*time.Second, "the waiter queued before the release")
	testenv.WaitFor(t, 5*time.Second, "both late waiters queued", func() bool { return len(stats(t, c.obs).Waiters) == 2 })

	acquires, carries, carriers := c.snapshot()
	if acquires != acquiresBefore {
		t.Errorf("%d acquire calls for the late waiters, want none: they go with one carrying call", acquires-acquiresBefore)
	}
	queued := waiterIDs(t, c.obs)
	if len(carries) != 1 || !slices.Equal(carries[0], queued) || carriers[0] != "" {
		t.Fatalf("carrying calls %v (releasing %q), want one that releases nothing and carries the queue %v in its order", carries, carriers, queued)
	}
	if c.a.Pending() != 0 {
		t.Fatalf("%d waiters still pending", c.a.Pending())
	}

	// FIFO: the waiter that arrived first is granted first.
	if err := q1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q2 := expectGrant(t, got2, "the second waiter")
	expectNothingYet(t, got3, "the third waiter, while the second holds the only permit")
	if err := q2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q3 := expectGrant(t, got3, "the third waiter")
	if err := q3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter pending behind a release in flight goes with the next release
// the process starts: no call of its own.
func TestTheNextReleaseCarriesAPendingWaiter(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 2)
	ctx := context.Background()
	p1, p2 := mustAcquire(t, c.a), mustAcquire(t, c.a)
	got1 := acquireQueued(t, c.a, c.obs, 1)
	released1 := c.releaseHeld(t, p1)
	acquiresBefore, _, _ := c.snapshot()
	got2 := c.acquirePending(t, ctx, 1)

	if err := p2.Release(ctx); err != nil { // carries the pending waiter, grants the queued one
		t.Fatal(err)
	}
	q1 := receiveGrant(t, got1, 5*time.Second, "the queued waiter, by the second release")
	acquires, carries, carriers := c.snapshot()
	if acquires != acquiresBefore {
		t.Errorf("%d acquire calls for the pending waiter, want none", acquires-acquiresBefore)
	}
	queued := waiterIDs(t, c.obs)
	if len(carries) != 1 || carriers[0] != p2.ID() || len(queued) != 1 || !slices.Equal(carries[0], queued) {
		t.Fatalf("carrying calls %v releasing %v, queue %v: want the release of %s to carry the one waiter queued", carries, carriers, queued, p2.ID())
	}
	// The semaphore was full: the release handed its permit straight to
	// the head and queued the carried waiter in the short call (handoff).
	if n := c.a.Handoffs(); n != 1 {
		t.Errorf("handoffs = %d after the carrying release, want 1", n)
	}

	c.letThrough(t, released1)
	q2 := expectGrant(t, got2, "the carried waiter, by the held release")
	if n := c.a.Handoffs(); n != 2 {
		t.Errorf("handoffs = %d after the held release, want 2", n)
	}
	for _, q := range []*semaphore.Permit{q1, q2} {
		if err := q.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	expectEmpty(t, c.obs, "after every release")
}

// A pending waiter that gives up leaves nothing to carry and nothing in
// Redis.
func TestAPendingWaiterThatGivesUpLeavesNoTrace(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 1)
	got1, released := c.oneQueuedBehindARelease(t)
	ctx, cancel := context.WithCancel(context.Background())
	got2 := c.acquirePending(t, ctx, 1)
	cancel()
	select {
	case r := <-got2:
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Acquire returned %v, %v; want context.Canceled", r.p, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled pending Acquire did not return")
	}
	if n := c.a.Pending(); n != 0 {
		t.Fatalf("%d waiters still pending after the only one gave up", n)
	}
	c.letThrough(t, released)
	q1 := receiveGrant(t, got1, 5*time.Second, "the queued waiter")
	if _, carries, _ := c.snapshot(); len(carries) != 0 {
		t.Fatalf("carrying calls %v after the only pending waiter gave up", carries)
	}
	if st := stats(t, c.obs); len(st.Waiters) != 0 {
		t.Fatalf("waiters %v in Redis, want none", st.Waiters)
	}
	_ = q1.Release(context.Background())
}

// A waiter that gives up while the call carrying it is in flight loses the
// place that call takes, once it has taken it.
func TestAWaiterThatGivesUpWhileCarriedLosesItsPlace(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 1)
	got1, released := c.oneQueuedBehindARelease(t)
	ctx, cancel := context.WithCancel(context.Background())
	got2 := c.acquirePending(t, ctx, 1)

	// Let the release through; the call that then carries the waiter is
	// held in turn.
	c.blockCarry.Store(true)
	c.letThrough(t, released)
	select {
	case <-c.held:
	case <-time.After(5 * time.Second):
		t.Fatal("no call carried the pending waiter")
	}
	cancel()
	if r := <-got2; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Acquire returned %v, %v; want context.Canceled", r.p, r.err)
	}
	c.open() // the carrier queues it now; its give-up must take it out
	q1 := receiveGrant(t, got1, 5*time.Second, "the queued waiter")
	testenv.WaitFor(t, 5*time.Second, "the carried place taken, then given back", func() bool {
		c.mu.Lock()
		carried := c.carried
		c.mu.Unlock()
		return carried == 1 && len(stats(t, c.obs).Waiters) == 0
	})
	if _, carries, _ := c.snapshot(); len(carries) != 1 {
		t.Fatalf("carrying calls %v, want one", carries)
	}
	// Had the place stayed, the next release would grant it to nobody.
	if err := q1.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, c.obs); st.Held != 0 {
		t.Fatalf("held %d after the last release: the given-up place was granted", st.Held)
	}
}

// When the call carrying them fails, the waiters ask on their own: none is
// lost, none queued twice, whether the call never ran or ran and its reply
// was lost.
func TestWaitersOfAFailedCarrierAskOnTheirOwn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(c *carryScene)
	}{
		{"never ran", func(c *carryScene) {
			var once atomic.Bool
			c.failCarry = func(redis.Cmder) bool { return once.CompareAndSwap(false, true) }
		}},
		{"reply lost", func(c *carryScene) { c.loseCarry.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCarryScene(t, 1)
			tc.fail(c)
			ctx := context.Background()
			got1, released := c.oneQueuedBehindARelease(t)
			acquiresBefore, _, _ := c.snapshot()
			got2 := c.acquirePending(t, ctx, 1)
			got3 := c.acquirePending(t, ctx, 1)
			c.letThrough(t, released)
			q := receiveGrant(t, got1, 5*time.Second, "the queued waiter")
			// The waiters ask on their own (as a retry: the carrier may have
			// queued them), and each has one place.
			testenv.WaitFor(t, 5*time.Second, "both late waiters asking on their own, queued once each", func() bool {
				acquires, _, _ := c.snapshot()
				ids := waiterIDs(t, c.obs)
				return acquires >= acquiresBefore+2 && len(ids) == 2 && ids[0] != ids[1]
			})
			c.loseCarry.Store(false)
			// Both are granted, one at a time, and nothing is left over.
			gots := []<-chan acquired{got2, got3}
			for range 2 {
				if err := q.Release(ctx); err != nil {
					t.Fatal(err)
				}
				select {
				case r := <-gots[0]:
					q, gots = r.p, gots[1:]
				case r := <-gots[len(gots)-1]:
					q, gots = r.p, gots[:len(gots)-1]
				case <-time.After(5 * time.Second):
					t.Fatal("a waiter of the failed carrier was never granted")
				}
				if q == nil {
					t.Fatal("a waiter of the failed carrier got no permit")
				}
			}
			if err := q.Release(ctx); err != nil {
				t.Fatal(err)
			}
			expectEmpty(t, c.obs, "after every release")
		})
	}
}

// A carried request heavier than the limit in Redis fails at once, as an
// acquire call of its own would.
func TestACarriedRequestOverTheLimitFails(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 1)
	got1, released := c.oneQueuedBehindARelease(t)
	got2 := c.acquirePending(t, context.Background(), 2)
	c.letThrough(t, released)
	select {
	case r := <-got2:
		if !errors.Is(r.err, semaphore.ErrExceedsLimit) {
			t.Fatalf("AcquireN(2) under a limit of 1 returned %v, %v; want ErrExceedsLimit", r.p, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AcquireN(2) under a limit of 1 waits")
	}
	q := receiveGrant(t, got1, 5*time.Second, "the queued waiter")
	if _, carries, _ := c.snapshot(); len(carries) != 1 {
		t.Fatalf("carrying calls %v, want one", carries)
	}
	if st := stats(t, c.obs); len(st.Waiters) != 0 {
		t.Fatalf("waiters %v, want none", st.Waiters)
	}
	_ = q.Release(context.Background())
}

// Under saturation many waiters are carried: fewer acquire calls than
// grants, and the limit holds throughout.
func TestUnderSaturationManyWaitersAreCarried(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	var acquireCalls, carriedTokens atomic.Int64
	h := &faultHook{before: func(cmd redis.Cmder) {
		switch {
		case isScript(cmd, semaphore.AcquireScript):
			acquireCalls.Add(1)
		case isCarry(cmd):
			carriedTokens.Add(int64(len(cmd.Args()) - (argToken + 5)))
		}
	}}
	const limit, goroutines = 2, 16
	sems := []*semaphore.Semaphore{
		newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: limit}),
		newSem(t, hookedClient(t, h), prefix, semaphore.Options{Limit: limit}),
	}
	// Until enough grants to tell, or 20 s on a machine too loaded to make
	// them (it took about 1.5 s for thousands alone).
	const enough = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var holding, most, grants atomic.Int64
	var wg sync.WaitGroup
	for i := range 2 * goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p, err := sems[i%2].Acquire(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				n := holding.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if grants.Add(1) >= enough {
					cancel()
				}
				time.Sleep(50 * time.Microsecond) // held, and counted, a while
				holding.Add(-1)
				if err := p.Release(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d grants, %d acquire calls, %d waiters carried", grants.Load(), acquireCalls.Load(), carriedTokens.Load())
	if most.Load() > limit {
		t.Fatalf("%d permits held at once, limit %d", most.Load(), limit)
	}
	if grants.Load() < enough {
		t.Fatalf("only %d grants in 20 s", grants.Load())
	}
	if carriedTokens.Load() == 0 || acquireCalls.Load() >= grants.Load() {
		t.Fatalf("%d acquire calls and %d carried waiters for %d grants: want waiters carried, fewer acquire calls than grants", acquireCalls.Load(), carriedTokens.Load(), grants.Load())
	}
}

// A carried waiter is refreshed like any other: it keeps its place for
// many leases, and is granted in turn.
func TestACarriedWaiterKeepsItsPlaceForManyLeases(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	// A refresh every 333 ms: a loaded machine under -race delays one by
	// a few hundred ms now and then, which a 300 ms lease did not survive.
	const lease = time.Second
	c := newCarrySceneOn(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	ctx := context.Background()
	got1, released := c.oneQueuedBehindARelease(t)
	got2 := c.acquirePending(t, ctx, 1)
	c.letThrough(t, released)
	q1 := receiveGrant(t, got1, 5*time.Second, "the queued waiter")
	testenv.WaitFor(t, 5*time.Second, "the carried waiter queued", func() bool { return len(stats(t, c.obs).Waiters) == 1 })
	queued := waiterIDs(t, c.obs)
	// Until its heartbeat has been refreshed several leases past the
	// deadline it had when queued: without refreshes it would have lapsed.
	const leases = 3
	alive := deadlineMs(rdb, prefix, "alive", queued[0])
	testenv.WaitFor(t, 10*leases*lease, "the carried waiter's heartbeat refreshed for several leases", func() bool {
		return deadlineMs(rdb, prefix, "alive", queued[0]) > alive+float64((leases*lease).Milliseconds())
	})
	if ids := waiterIDs(t, c.obs); !slices.Equal(ids, queued) {
		t.Fatalf("after %d leases: waiters %v, want %v still queued (its heartbeat refreshed)", leases, ids, queued)
	}
	if err := q1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q2 := expectGrant(t, got2, "the carried waiter, after many leases")
	if err := q2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A release that hangs does not hold back the waiters behind it for
// longer than a moment: they are sent anyway.
func TestPendingWaitersAreSentWhileAReleaseHangs(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 1)
	got1, released := c.oneQueuedBehindARelease(t)
	got2 := c.acquirePending(t, context.Background(), 1)
	start := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the pending waiter queued while the release hangs", func() bool { return len(stats(t, c.obs).Waiters) == 2 })
	if d := time.Since(start); d > time.Second {
		t.Errorf("the pending waiter was sent after %v, want within moments", d)
	}
	if _, carries, carriers := c.snapshot(); len(carries) != 1 || carriers[0] != "" {
		t.Fatalf("carrying calls %v releasing %v, want one of its own", carries, carriers)
	}
	c.letThrough(t, released)
	q1 := receiveGrant(t, got1, 5*time.Second, "the first waiter")
	if err := q1.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	q2 := expectGrant(t, got2, "the waiter sent while the release hung")
	_ = q2.Release(context.Background())
}

// Close fails a pending waiter and sends nothing for it: Redis never heard
// of it.
func TestCloseFailsAPendingWaiterWithoutACall(t *testing.T) {
	t.Parallel()
	c := newCarryScene(t, 1)
	got1, released := c.oneQueuedBehindARelease(t)
	got2 := c.acquirePending(t, context.Background(), 1)
	closed := make(chan error, 1)
	go func() { closed <- c.a.Close() }()
	for _, got := range []<-chan acquired{got2} {
		select {
		case r := <-got:
			if !errors.Is(r.err, semaphore.ErrClosed) {
				t.Fatalf("a pending Acquire at Close returned %v, %v; want ErrClosed", r.p, r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a pending Acquire did not return at Close")
		}
	}
	c.open()
	if err := <-released; err != nil && !errors.Is(err, semaphore.ErrClosed) {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	if q := <-got1; q != nil {
		_ = q.Release(context.Background())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tok := range c.released {
		if !c.sent[tok] {
			t.Errorf("released %s, which no call ever sent to Redis", tok)
		}
	}
	expectEmpty(t, c.obs, "after Close")
}
