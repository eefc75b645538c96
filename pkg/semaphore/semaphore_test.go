package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/drain"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

func TestNewRejectsBadConfigWithErrorsThatNameTheFix(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	cases := []struct {
		name string
		sem  string
		opts semaphore.Options
		want string
	}{
		{"empty name", "", semaphore.Options{Limit: 1}, "empty name"},
		{"limit zero", "db", semaphore.Options{}, "Options.Limit is 0"},
		{"negative limit", "db", semaphore.Options{Limit: -3}, "at least 1"},
		{"short lease", "db", semaphore.Options{Limit: 1, Lease: time.Millisecond}, "shorter than the minimum"},
		{"brace in name", "d{b}", semaphore.Options{Limit: 1}, "hash tag"},
		{"brace in prefix", "db", semaphore.Options{Limit: 1, Prefix: "x{y}"}, "must not contain"},
	}
	for _, c := range cases {
		if c.opts.Prefix == "" {
			c.opts.Prefix = prefix
		}
		_, err := semaphore.New(rdb, c.sem, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New error = %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := semaphore.New(nil, "db", semaphore.Options{Limit: 1}); err == nil {
		t.Error("New with a nil client succeeded")
	}
}

func TestAcquireNRejectsImpossibleWeightsAtOnce(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 3})
	ctx := context.Background() // no deadline: a wait would hang the test

	if _, err := s.AcquireN(ctx, 0); err == nil || !strings.Contains(err.Error(), "less than 1") {
		t.Errorf("AcquireN(0) = %v, want an error about the weight", err)
	}
	if _, err := s.AcquireN(ctx, 4); !errors.Is(err, semaphore.ErrExceedsLimit) {
		t.Errorf("AcquireN(4) with limit 3 = %v, want ErrExceedsLimit", err)
	}
	// The live limit rules, not the configured one.
	if err := s.SetLimit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireN(ctx, 3); !errors.Is(err, semaphore.ErrExceedsLimit) || !strings.Contains(err.Error(), "limit is 2") {
		t.Errorf("AcquireN(3) with live limit 2 = %v, want ErrExceedsLimit naming limit 2", err)
	}
	if err := s.SetLimit(ctx, 0); err == nil {
		t.Error("SetLimit(0) succeeded")
	}
	if st := stats(t, s); len(st.Waiters) != 0 || len(st.Holders) != 0 {
		t.Errorf("rejected requests left state behind: %+v", st)
	}
}

func TestAcquireAndReleaseWhenFree(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 2})
	ctx := context.Background()

	p, err := s.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	st := stats(t, s)
	if st.Limit != 2 || st.Held != 2 || len(st.Holders) != 1 || st.Holders[0].Fence != p.Fence() || st.Holders[0].ID != p.ID() {
		t.Fatalf("stats while held = %+v", st)
	}
	if st.Holders[0].LeaseLeft <= 0 || st.Holders[0].LeaseLeft > semaphore.DefaultLease {
		t.Errorf("lease left = %v, want within (0, %v]", st.Holders[0].LeaseLeft, semaphore.DefaultLease)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Context().Err() == nil {
		t.Error("the permit's context is not done after Release")
	}
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Errorf("second Release = %v, want ErrNotHeld", err)
	}
	if st := stats(t, s); st.Held != 0 || len(st.Holders) != 0 {
		t.Errorf("stats after release = %+v", st)
	}
}

func TestConfiguredLimitOnlyInitialisesTheLimitInRedis(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	a := newSem(t, rdb, prefix, semaphore.Options{Limit: 5})
	if err := mustAcquire(t, a).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, a); st.Limit != 5 {
		t.Fatalf("limit = %d, want 5 from the first client", st.Limit)
	}
	b := newSem(t, rdb, prefix, semaphore.Options{Limit: 9})
	if err := mustAcquire(t, b).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, b); st.Limit != 5 {
		t.Errorf("a second client with Limit 9 changed the limit to %d", st.Limit)
	}
	if err := b.SetLimit(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, a); st.Limit != 7 {
		t.Errorf("after SetLimit(7) on another handle, limit = %d", st.Limit)
	}
}

func TestTryAcquireNeverWaits(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 3})
	ctx := context.Background()
	p, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquireN(ctx, 3); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("TryAcquireN(3) with 1 of 3 held = %v, want ErrNoPermit", err)
	}
	// A queued heavy waiter is not overtaken by TryAcquire, although two
	// permits are free and TryAcquire asks for one.
	got := make(chan error, 1)
	go func() {
		q, err := s.AcquireN(ctx, 3)
		if err == nil {
			err = q.Release(ctx)
		}
		got <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "a queued waiter", func() bool { return len(stats(t, s).Waiters) == 1 })
	if q, err := s.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("TryAcquire with free capacity but a waiter queued = %v, want ErrNoPermit", err)
		if q != nil {
			_ = q.Release(ctx) // or the queued waiter would wait forever
		}
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); len(st.Waiters) != 0 || st.Held != 0 {
		t.Errorf("stats after TryAcquire calls = %+v", st)
	}
}

func TestDoReleasesAndReturnsTheFunctionsError(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	ctx := context.Background()
	boom := errors.New("boom")
	var inside context.Context
	err := s.Do(ctx, func(ctx context.Context) error {
		inside = ctx
		if st := stats(t, s); st.Held != 1 {
			t.Errorf("held inside Do = %d, want 1", st.Held)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("Do = %v, want boom", err)
	}
	if inside.Err() == nil {
		t.Error("the context given to fn is not done after Do")
	}
	if st := stats(t, s); st.Held != 0 {
		t.Errorf("held after Do = %d, want 0", st.Held)
	}
	func() {
		defer func() { _ = recover() }()
		_ = s.Do(ctx, func(context.Context) error { panic("x") })
	}()
	if st := stats(t, s); st.Held != 0 {
		t.Errorf("held after a panic in Do = %d, want 0", st.Held)
	}
}

func TestCancelledAcquireLeavesTheSemaphoreUnchanged(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	ctx := context.Background()
	p := mustAcquire(t, s)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline = %v, want DeadlineExceeded", err)
	}
	testenv.WaitFor(t, 5*time.Second, "the cancelled waiter to leave the queue", func() bool { return len(stats(t, s).Waiters) == 0 })
	if st := stats(t, s); st.Held != 1 {
		t.Fatalf("after a cancelled Acquire: %+v, want 1 held", st)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st.Held != 0 {
		t.Errorf("a cancelled waiter was granted the released permit: %+v", st)
	}
}

func TestFencesStrictlyIncrease(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	// Three handles, as three processes: most permits go from one to the
	// next by the short hand-off (handoff_test.go), across processes and
	// within them, the rest by the whole release or at once.
	sems := []*semaphore.Semaphore{
		newSem(t, rdb, prefix, semaphore.Options{Limit: 1}),
		newSem(t, rdb, prefix, semaphore.Options{Limit: 1}),
		newSem(t, rdb, prefix, semaphore.Options{Limit: 1}),
	}
	ctx := context.Background()
	// With limit 1 grants are totally ordered: each holder must see a fence
	// above every earlier holder's, however it was granted.
	var mu sync.Mutex
	var last int64
	var holding bool
	var wg sync.WaitGroup
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				p, err := sems[g%3].Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if p.Fence() <= last || holding {
					t.Errorf("fence %d after fence %d, another holder still holding: %v", p.Fence(), last, holding)
				}
				last, holding = p.Fence(), true
				mu.Unlock()
				time.Sleep(100 * time.Microsecond) // held a while: another holder now would be seen
				mu.Lock()
				holding = false
				mu.Unlock()
				if err := p.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if last < 240 {
		t.Errorf("last fence %d, want at least 240 grants", last)
	}
	var handoffs uint64
	for _, s := range sems {
		handoffs += s.Handoffs()
	}
	if handoffs < 120 {
		t.Errorf("%d of 240 releases took the short hand-off, want at least half: the test no longer covers it", handoffs)
	}
}

func TestRaisingTheLimitWakesWaitersAtOnce(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	// A long lease: no watchdog refresh (which also grants) can happen
	// within the test, so only SetLimit can have granted.
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	ctx := context.Background()
	p := mustAcquire(t, s)
	defer p.Release(ctx)
	granted := make(chan *semaphore.Permit, 3)
	for i := 0; i < 3; i++ {
		go func() {
			q, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
			}
			granted <- q
		}()
	}
	testenv.WaitFor(t, 5*time.Second, "3 waiters", func() bool { return len(stats(t, s).Waiters) == 3 })
	if err := s.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// Two fit under the new limit and must be granted by SetLimit itself:
	// nobody releases anything here.
	for i := 0; i < 2; i++ {
		select {
		case q := <-granted:
			defer q.Release(ctx)
		case <-time.After(time.Second):
			t.Fatal("raising the limit did not grant waiters")
		}
	}
	if st := stats(t, s); st.Held != 3 || len(st.Waiters) != 1 {
		t.Errorf("after raising the limit to 3: %+v", st)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	(<-granted).Release(ctx)
}

func TestLoweringTheLimitBelowAQueuedWeightFailsThatWaiter(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 4, Lease: time.Minute})
	ctx := context.Background()
	p, err := s.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := s.AcquireN(ctx, 4)
		got <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the heavy waiter", func() bool { return len(stats(t, s).Waiters) == 1 })
	if err := s.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, semaphore.ErrExceedsLimit) {
			t.Errorf("heavy waiter got %v, want ErrExceedsLimit", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the heavy waiter was not failed")
	}
}

func TestCloseFailsWaitersAndReleasesPermits(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	observer := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	ctx := context.Background()
	p := mustAcquire(t, s)
	got := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx)
		got <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "a waiter", func() bool { return len(stats(t, observer).Waiters) == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, semaphore.ErrClosed) {
		t.Errorf("waiter after Close = %v, want ErrClosed", err)
	}
	if !errors.Is(context.Cause(p.Context()), semaphore.ErrClosed) {
		t.Errorf("permit context cause after Close = %v, want ErrClosed", context.Cause(p.Context()))
	}
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
	if st := stats(t, observer); st.Held != 0 || len(st.Waiters) != 0 {
		t.Errorf("after Close: %+v, want nothing held or queued", st)
	}
	if _, err := s.Acquire(ctx); !errors.Is(err, semaphore.ErrClosed) {
		t.Errorf("Acquire after Close = %v, want ErrClosed", err)
	}
}

// Looking must not change anything: Stats on a semaphore nobody has used
// yet sets no limit, so the first worker's Options.Limit still applies.
func TestStatsOfAnUnusedSemaphoreSetsNoLimit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	looker := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	st := stats(t, looker)
	if st.Limit != 0 {
		t.Fatalf("Stats of an unused semaphore: limit %d, want 0 (none yet)", st.Limit)
	}
	worker := newSem(t, rdb, prefix, semaphore.Options{Limit: 8})
	p := mustAcquire(t, worker)
	defer p.Release(context.Background())
	if st := stats(t, looker); st.Limit != 8 {
		t.Errorf("limit after the first Acquire: %d, want the worker's 8", st.Limit)
	}
}

// A draining process gives up its places in the queue at once, keeps the
// permits it holds until they are released, and asks for no more; the
// rest of the fleet, queued behind it, gets the permits next.
func TestDrainGivesUpWaitingPlacesAndKeepsHeldPermits(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	stopping := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	held := mustAcquire(t, stopping)
	const waiting = 3
	errs := make(chan error, waiting)
	for range waiting {
		go func() {
			p, err := stopping.Acquire(context.Background())
			if p != nil {
				_ = p.Release(context.Background())
			}
			errs <- err
		}()
	}
	testenv.WaitFor(t, 5*time.Second, "three waiters", func() bool { return len(stats(t, other).Waiters) == waiting })
	fleet := acquireQueued(t, other, other, waiting+1)

	stopping.Drain()
	for range waiting {
		select {
		case err := <-errs:
			if !errors.Is(err, semaphore.ErrDraining) {
				t.Errorf("a waiting Acquire of a drained semaphore: %v, want ErrDraining", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiting Acquire did not return after Drain")
		}
	}
	st := stats(t, other)
	if st.Held != 1 || len(st.Waiters) != 1 {
		t.Errorf("after Drain: %d held, %d waiting; want the held permit kept and the fleet's one waiter left", st.Held, len(st.Waiters))
	}
	if _, err := stopping.Acquire(context.Background()); !errors.Is(err, semaphore.ErrDraining) {
		t.Errorf("an Acquire after Drain: %v, want ErrDraining", err)
	}
	if err := held.Release(context.Background()); err != nil {
		t.Errorf("releasing the permit held across Drain: %v", err)
	}
	p := receiveGrant(t, fleet, 5*time.Second, "the fleet's waiter, with the permit the drained process released")
	_ = p.Release(context.Background())
}

// Under a drain notice, Drain refuses the work that has not held a permit
// yet (drain.Refused says so, whatever became of the error), and lets work that
// has take the further permits it needs, waiting its turn.
func TestDrainLetsWorkThatHasBegunTakeItsNextPermit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	ctx := context.Background()
	begun := drain.With(ctx)
	first, err := s.Acquire(begun)
	if err != nil {
		t.Fatal(err)
	}
	notYet := drain.With(ctx)
	refused := make(chan error, 1)
	go func() { _, err := s.Acquire(notYet); refused <- err }()
	testenv.WaitFor(t, 5*time.Second, "the second piece of work waiting", func() bool { return len(stats(t, s).Waiters) == 1 })

	s.Drain()
	if err := <-refused; !errors.Is(err, semaphore.ErrDraining) || !drain.Refused(notYet) {
		t.Errorf("work that never held a permit: %v (Drained %v), want ErrDraining, noted", err, drain.Refused(notYet))
	}
	next := make(chan error, 1)
	go func() {
		p, err := s.Acquire(begun)
		if err == nil {
			err = p.Release(ctx)
		}
		next <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the begun work's next Acquire waiting its turn", func() bool { return len(stats(t, s).Waiters) == 1 })
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-next; err != nil || drain.Refused(begun) {
		t.Errorf("the begun work's next permit after Drain: %v (Drained %v), want granted", err, drain.Refused(begun))
	}
	if _, err := s.Acquire(ctx); !errors.Is(err, semaphore.ErrDraining) {
		t.Errorf("an Acquire without a notice after Drain: %v, want ErrDraining", err)
	}
}
