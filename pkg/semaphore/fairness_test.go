package semaphore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

func TestWaitersAreGrantedInTicketOrder(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	// Waiters spread over three handles, as over three processes.
	sems := []*semaphore.Semaphore{
		newSem(t, rdb, prefix, semaphore.Options{Limit: 1}),
		newSem(t, rdb, prefix, semaphore.Options{Limit: 1}),
		newSem(t, rdb, prefix, semaphore.Options{Limit: 1}),
	}
	ctx := context.Background()
	first, err := sems[0].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := sems[i%3].Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := p.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		// Queue them one at a time so that ticket order is i's order.
		testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return len(stats(t, sems[0]).Waiters) == i+1 })
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("grant order %v, want 0..%d in order", order, n-1)
		}
	}
	// The permit went from holder to holder by the short hand-off
	// (handoff_test.go): it keeps the order too.
	var handoffs uint64
	for _, s := range sems {
		handoffs += s.Handoffs()
	}
	if handoffs < n/2 {
		t.Errorf("%d of %d releases took the short hand-off, want most: the test no longer covers it", handoffs, n)
	}
}

func TestHeavyWaiterAtTheHeadIsNotOvertakenByLightOnes(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 3})
	ctx := context.Background()
	small := mustAcquire(t, s)
	var events []string
	var mu sync.Mutex
	log := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	heavyGot := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := s.AcquireN(ctx, 3)
		if err != nil {
			t.Error(err)
		}
		log("heavy")
		heavyGot <- p
	}()
	testenv.WaitFor(t, 5*time.Second, "heavy queued", func() bool { return len(stats(t, s).Waiters) == 1 })
	lightDone := make(chan struct{})
	go func() {
		defer close(lightDone)
		p, err := s.Acquire(ctx) // would fit (1 held + 1 <= 3), but heavy is ahead
		if err != nil {
			t.Error(err)
			return
		}
		log("light")
		_ = p.Release(ctx)
	}()
	testenv.WaitFor(t, 5*time.Second, "light queued", func() bool { return len(stats(t, s).Waiters) == 2 })
	if st := stats(t, s); st.Held != 1 {
		t.Fatalf("the light waiter overtook the heavy one: %+v", st)
	}
	if err := small.Release(ctx); err != nil {
		t.Fatal(err)
	}
	heavy := <-heavyGot
	if st := stats(t, s); st.Held != 3 || len(st.Waiters) != 1 {
		t.Errorf("after the heavy grant: %+v", st)
	}
	_ = heavy.Release(ctx)
	<-lightDone
	if strings.Join(events, ",") != "heavy,light" {
		t.Errorf("grant order %v, want heavy then light", events)
	}
}

// A release that frees less than the head needs leaves the head as it was:
// same ticket, still ahead of everyone behind it, and nobody granted.
func TestHeadThatDoesNotFitKeepsItsTicketThroughReleases(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 3})
	ctx := context.Background()
	a, b := mustAcquire(t, s), mustAcquire(t, s)
	heavyGot := acquireNQueued(t, s, s, 3, 1)
	lightGot := acquireQueued(t, s, s, 2)
	places := func(ws []semaphore.Waiter) []string {
		var out []string
		for _, w := range ws {
			out = append(out, fmt.Sprintf("%s@%d", w.ID, w.Ticket))
		}
		return out
	}
	before := places(stats(t, s).Waiters)

	// Frees one of the three the head needs. Stats reads Redis after the
	// release returned: a grant it made would show as a holder.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	after := stats(t, s)
	if got := places(after.Waiters); !slices.Equal(got, before) || after.Held != 1 {
		t.Fatalf("after a release that freed too little: held %d, waiters %v; want held 1 and the queue unchanged, %v", after.Held, got, before)
	}

	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	heavy := receiveGrant(t, heavyGot, 5*time.Second, "the heavy head, once all three are free")
	if st := stats(t, s); st.Held != 3 || len(st.Waiters) != 1 {
		t.Fatalf("after the heavy head's grant: held %d, %d waiting; want 3 held and the light waiter still queued", st.Held, len(st.Waiters))
	}
	if err := heavy.Release(ctx); err != nil {
		t.Fatal(err)
	}
	light := receiveGrant(t, lightGot, 5*time.Second, "the light waiter, after the heavy one")
	_ = light.Release(ctx)
}

func TestReleaseHandsThePermitOverWithoutPolling(t *testing.T) {
	t.Parallel()
	// A server of the test's own, whose every command counts: the
	// dispatchers' pops too, which no client hook sees (they block on
	// connections of their own).
	srv := testenv.PrivateRedisServer(t)
	holderSem := newSem(t, srv.Client, "poll", semaphore.Options{Limit: 1})
	// The waiter's own client, whose every command we count. The lease is
	// long so that no watchdog refresh falls inside the measured window.
	counter := &cmdCounter{n: map[string]int{}}
	wopt, _ := redis.ParseURL(srv.URL)
	wrdb := redis.NewClient(wopt)
	t.Cleanup(func() { _ = wrdb.Close() }) // after the semaphore's Close, registered later
	wrdb.AddHook(counter)
	waiterSem := newSem(t, wrdb, "poll", semaphore.Options{Limit: 1, Lease: time.Minute})
	ctx := context.Background()
	processed := func() int {
		info, err := srv.Client.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(benchutil.InfoField(info, "total_commands_processed"))
		if err != nil {
			t.Fatalf("INFO stats: total_commands_processed: %v", err)
		}
		return n
	}

	p := mustAcquire(t, holderSem)
	granted := acquireQueued(t, waiterSem, holderSem, 1)
	before, processedBefore := counter.snapshot(), processed()
	time.Sleep(time.Second) // the claim is a quiet window: a polling waiter would retry many times in it
	during, processedDuring := counter.snapshot(), processed()
	scripts := func(m map[string]int) int { return m["evalsha"] + m["eval"] + m["fcall"] }
	if scripts(during) != scripts(before) {
		t.Fatalf("the waiter ran scripts while waiting: before %v, after %v", before, during)
	}
	// The first INFO, and at most a watchdog refresh of the holder's
	// lease, whose interval a second may straddle.
	if n := processedDuring - processedBefore; n > 2 {
		t.Fatalf("the server ran %d commands in a second while nothing was granted: something polled", n)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := <-granted
	after := counter.snapshot()
	// The grant arrived on the pop that was already waiting: no new script.
	if scripts(after) != scripts(during) {
		t.Errorf("the waiter ran a script to get its permit: %v -> %v", during, after)
	}
	if q.Fence() <= p.Fence() {
		t.Errorf("hand-off fence %d not above the releaser's %d", q.Fence(), p.Fence())
	}
	_ = q.Release(ctx)
}

func TestFiveHundredWaitersShareOneBlockingConnection(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	opt, _ := redis.ParseURL(testenv.RedisURL(t))
	name := strings.ReplaceAll(prefix, ":", "-")
	opt.ClientName = name
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	admin, _ := testenv.Redis(t)
	ctx := context.Background()

	p := mustAcquire(t, s)
	const waiters = 500
	var granted atomic.Int64
	var wg sync.WaitGroup
	wait := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			granted.Add(1)
			_ = q.Release(ctx)
		}()
	}
	for i := 0; i < waiters; i++ {
		wait()
	}
	testenv.WaitFor(t, 30*time.Second, "500 waiters queued", func() bool { return len(stats(t, s).Waiters) == waiters })
	count := func() (conns, blocked int) {
		list, err := admin.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, " name="+name+" ") {
				continue
			}
			conns++
			if (strings.Contains(line, " cmd=blmpop ") || strings.Contains(line, " cmd=blpop ")) && strings.Contains(line, " flags=b ") {
				blocked++
			}
		}
		return conns, blocked
	}
	testenv.WaitFor(t, 10*time.Second, "the dispatcher's blocking pop", func() bool { _, b := count(); return b >= 1 })
	// The same at three moments, not one lucky snapshot: each after one
	// more waiter queued.
	const more = 2
	for i := 0; ; i++ {
		conns, blocked := count()
		if blocked != 1 {
			t.Errorf("%d blocked connections for %d waiters, want 1", blocked, waiters+i)
		}
		t.Logf("%d waiters: %d connections, %d blocked", waiters+i, conns, blocked)
		if i == more {
			break
		}
		wait()
		testenv.WaitFor(t, 10*time.Second, "one more waiter queued", func() bool { return len(stats(t, s).Waiters) == waiters+i+1 })
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if granted.Load() != waiters+more {
		t.Errorf("%d of %d waiters granted", granted.Load(), waiters+more)
	}
}

func TestHeldWeightNeverExceedsTheLimit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const limit = 5
	sems := []*semaphore.Semaphore{
		newSem(t, rdb, prefix, semaphore.Options{Limit: limit}),
		newSem(t, rdb, prefix, semaphore.Options{Limit: limit}),
	}
	ctx := context.Background()
	var held, maxHeld atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var sampled atomic.Int64
	sampler := make(chan struct{})
	go func() { // Redis's own view, sampled while the goroutines churn
		defer close(sampler)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := sems[0].Stats(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if st.Held > limit {
				t.Errorf("Redis reports %d held, limit %d", st.Held, limit)
			}
			sampled.Add(1)
		}
	}()
	for g := 0; g < 24; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				w := 1 + (g+i)%3
				p, err := sems[g%2].AcquireN(ctx, w)
				if err != nil {
					t.Error(err)
					return
				}
				n := held.Add(int64(w))
				for {
					m := maxHeld.Load()
					if n <= m || maxHeld.CompareAndSwap(m, n) {
						break
					}
				}
				if n > limit {
					t.Errorf("%d held, limit %d", n, limit)
				}
				time.Sleep(200 * time.Microsecond) // held a while
				held.Add(-int64(w))
				if err := p.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampler
	if maxHeld.Load() < limit-1 {
		t.Errorf("max held %d: the test never came near the limit %d, so it proved nothing", maxHeld.Load(), limit)
	}
	if sampled.Load() == 0 {
		t.Error("Redis state was never sampled")
	}
}
