package semaphore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// slack absorbs scheduling noise on a loaded 2-core machine running the
// race detector; the bounds below are the design's plus slack.
const slack = 500 * time.Millisecond

// A holder killed with SIGKILL never releases: its permit must come back
// when its lease runs out, plus at most one check — and not before the lease
// it last refreshed has run out.
func TestKilledHolderGivesItsPermitBackWithinItsLease(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const lease = time.Second
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	h := startHelper(t, "hold", prefix, "SEMTEST_LEASE="+lease.String())
	fence, _ := strconv.ParseInt(h.expect(t, "fence", 10*time.Second), 10, 64)
	// The helper is alive and refreshing: its permit must outlive the lease
	// it was granted with. Redis's deadline a whole lease past the first one
	// means a refresh landed after the first had passed.
	tok := stats(t, s).Holders[0].ID
	first := deadlineMs(rdb, prefix, "holders", tok)
	testenv.WaitFor(t, 10*lease, "the helper's lease refreshed past its first deadline", func() bool {
		return deadlineMs(rdb, prefix, "holders", tok) > first+float64(lease.Milliseconds())
	})
	// Refreshed, not kept lost for the helper to release.
	if info := rdb.HGet(context.Background(), prefix+":{db}:info", tok).Val(); strings.HasSuffix(info, ":lost") {
		t.Fatalf("the live helper's permit was lost: %q", info)
	}
	if _, err := s.TryAcquire(context.Background()); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("a live holder's permit was taken: %v", err)
	}
	// Its lease deadline in Redis, as its last refresh before the kill set
	// it (a refresh after this read only moves it later).
	st := stats(t, s)
	if len(st.Holders) != 1 {
		t.Fatalf("holders %+v, want the helper's", st.Holders)
	}
	k := prefix + ":{db}:"
	deadline, err := rdb.ZScore(context.Background(), k+"holders", st.Holders[0].ID).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*lease)
	defer cancel()
	p, err := s.Acquire(ctx)
	if err != nil {
		t.Fatalf("permit of a killed holder not returned: %v", err)
	}
	took := time.Since(killed)
	t.Logf("permit returned %v after kill -9 (lease %v)", took, lease)
	// Not before the dead holder's lease ran out, in Redis's own time (its
	// last refresh may have come late on a loaded machine, so the kill is
	// no measure of it); the waiter's own watchdog purges at most Lease/3
	// after the lease ends.
	info, err := rdb.HGet(context.Background(), k+"info", p.ID()).Result()
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.SplitN(info, ":", 3) // fence:grantedAtMs
	if len(parts) < 2 {
		t.Fatalf("the new holder's info %q, want fence:grantedAtMs", info)
	}
	granted, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		t.Fatalf("the new holder's info %q: %v", info, err)
	}
	if float64(granted) < deadline {
		t.Errorf("permit granted at %d ms, before the killed holder's lease ran out at %.0f ms (Redis time)", granted, deadline)
	}
	if took > lease+lease/3+slack {
		t.Errorf("permit returned %v after the kill, want within %v", took, lease+lease/3+slack)
	}
	if p.Fence() <= fence {
		t.Errorf("fence %d not above the dead holder's %d", p.Fence(), fence)
	}
	_ = p.Release(context.Background())
}

// A waiter killed at the head of the queue must stop blocking the queue
// within its heartbeat deadline, even when a release grants it the permit
// after it died.
func TestKilledWaiterStopsBlockingTheQueueWithinItsHeartbeat(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const lease = time.Second
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	ctx := context.Background()
	p := mustAcquire(t, s)
	h := startHelper(t, "wait", prefix, "SEMTEST_LEASE="+lease.String())
	testenv.WaitFor(t, 10*time.Second, "the helper queued", func() bool { return len(stats(t, s).Waiters) == 1 })
	got := make(chan error, 1)
	go func() {
		q, err := s.Acquire(ctx) // queued behind the helper
		if err == nil {
			err = q.Release(ctx)
		}
		got <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "two waiters", func() bool { return len(stats(t, s).Waiters) == 2 })
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// Released at once: the grant goes to the dead head of the queue.
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("queue unblocked %v after the head waiter was killed (heartbeat %v)", time.Since(killed), lease)
	case <-time.After(lease + lease/3 + slack):
		t.Fatalf("a dead waiter blocked the queue for longer than its heartbeat and one check: %+v", stats(t, s))
	}
}

// A holder paused (SIGSTOP) past its lease loses the permit to the next
// waiter; when it resumes, its context is cancelled with ErrLeaseLost and
// its Release says so. The next holder's fence is higher.
func TestPausedHolderLearnsItsLeaseWasLost(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const lease = time.Second
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	h := startHelper(t, "hold", prefix, "SEMTEST_LEASE="+lease.String())
	oldFence, _ := strconv.ParseInt(h.expect(t, "fence", 10*time.Second), 10, 64)
	if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), lease+lease/3+slack)
	defer cancel()
	p, err := s.Acquire(ctx)
	if err != nil {
		_ = h.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatalf("a paused holder's permit was not taken over after its lease: %v", err)
	}
	defer p.Release(context.Background())
	if p.Fence() <= oldFence {
		t.Errorf("new fence %d not above the paused holder's %d", p.Fence(), oldFence)
	}
	resumed := time.Now()
	if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Within one refresh interval of resuming (in practice at once: the
	// missed tick fires on resume and finds the lease expired locally).
	cause := h.expect(t, "lost", lease/3+slack)
	t.Logf("resumed holder's context cancelled %v after SIGCONT", time.Since(resumed))
	if !strings.Contains(cause, semaphore.ErrLeaseLost.Error()) {
		t.Errorf("context cause after resuming = %q, want ErrLeaseLost", cause)
	}
	h.send(t, "release")
	h.expect(t, "released-lost", 5*time.Second)
	if st := stats(t, s); len(st.Holders) != 1 || st.Holders[0].ID != p.ID() {
		t.Errorf("the resumed holder's Release disturbed the new holder: %+v", st)
	}
}

// Three processes of eight goroutines, random weights: the sum held never
// exceeds the limit (checked by every holder against a shared counter) and
// every grant's fence is unique.
func TestProcessesContendingNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const limit = 4
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: limit})
	var helpers []*helper
	for i := 0; i < 3; i++ {
		helpers = append(helpers, startHelper(t, "churn", prefix,
			"SEMTEST_LIMIT="+strconv.Itoa(limit), "SEMTEST_GOROUTINES=8", "SEMTEST_ITERS=40", "SEMTEST_MAXW=2"))
	}
	var mu sync.Mutex
	fences := map[string]bool{}
	var wg sync.WaitGroup
	for _, h := range helpers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout := time.After(2 * time.Minute)
			for {
				select {
				case line, ok := <-h.lines:
					if !ok {
						t.Error("helper exited before done")
						return
					}
					switch {
					case line == "done":
						return
					case strings.HasPrefix(line, "fence "):
						mu.Lock()
						if fences[line] {
							t.Errorf("duplicate %s", line)
						}
						fences[line] = true
						mu.Unlock()
					default:
						t.Errorf("helper: %s", line)
					}
				case <-timeout:
					t.Error("helper did not finish")
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(fences) != 3*8*40 {
		t.Errorf("%d grants, want %d", len(fences), 3*8*40)
	}
	if st := stats(t, s); st.Held != 0 || len(st.Waiters) != 0 {
		t.Errorf("after all processes finished: %+v", st)
	}
}
