package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// events records what a handle tells its Observer.
type events struct {
	mu                      sync.Mutex
	granted, released, lost []int // weights
	waited, held            []time.Duration
}

func (e *events) Granted(sem string, weight int, waited time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.granted = append(e.granted, weight)
	e.waited = append(e.waited, waited)
}

func (e *events) Released(sem string, weight int, held time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.released = append(e.released, weight)
	e.held = append(e.held, held)
}

func (e *events) LeaseLost(sem string, weight int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lost = append(e.lost, weight)
}

func (e *events) counts() (granted, released, lost int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.granted), len(e.released), len(e.lost)
}

func TestObserverSeesEachGrantWithItsWaitAndEachReleaseWithItsHoldTime(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ev := &events{}
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 2, Observer: ev})
	ctx := context.Background()
	first, err := s.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireQueued(t, s, s, 1)
	// The queued Acquire waits at least this long, by Redis's clock.
	const hold = 50 * time.Millisecond
	testenv.WaitFor(t, 5*time.Second, "the waiter queued a while", func() bool {
		st := stats(t, s)
		return len(st.Waiters) == 1 && st.Waiters[0].Age > hold // in whole milliseconds
	})
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := receiveGrant(t, got, 5*time.Second, "the queued Acquire")
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.granted) != 2 || ev.granted[0] != 2 || ev.granted[1] != 1 {
		t.Fatalf("Granted weights %v, want [2 1]", ev.granted)
	}
	if len(ev.released) != 2 || ev.released[0] != 2 || ev.released[1] != 1 {
		t.Fatalf("Released weights %v, want [2 1]: once per permit, not for a second Release", ev.released)
	}
	if ev.waited[1] < hold {
		t.Errorf("the queued Acquire waited %v by the Observer, but it was queued for at least %v", ev.waited[1], hold)
	}
	if ev.held[0] < hold {
		t.Errorf("the first permit was held %v by the Observer, but it was held for at least %v", ev.held[0], hold)
	}
	if len(ev.lost) != 0 {
		t.Errorf("LeaseLost called %d times, want none", len(ev.lost))
	}
}

func TestObserverSeesAPermitThatCloseTookBackReleasedOnce(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ev := &events{}
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Observer: ev})
	p := mustAcquire(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(context.Background()); !errors.Is(err, semaphore.ErrClosed) {
		t.Fatalf("Release after Close = %v, want ErrClosed", err)
	}
	if g, r, l := ev.counts(); g != 1 || r != 1 || l != 0 {
		t.Fatalf("granted %d, released %d, lost %d; want 1, 1, 0", g, r, l)
	}
}

func TestObserverSeesALostLeaseAndThenTheRelease(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ev := &events{}
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: 300 * time.Millisecond, Observer: ev})
	p := mustAcquire(t, s)
	// Redis forgets the holder: the next refresh finds the permit gone.
	if err := rdb.Del(context.Background(), prefix+":{db}:holders").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the permit's context was not cancelled after Redis dropped it")
	}
	if _, _, l := ev.counts(); l != 1 {
		t.Fatalf("LeaseLost called %d times, want 1", l)
	}
	if err := p.Release(context.Background()); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	if g, r, l := ev.counts(); g != 1 || r != 1 || l != 1 {
		t.Fatalf("granted %d, released %d, lost %d; want 1, 1, 1", g, r, l)
	}
}
