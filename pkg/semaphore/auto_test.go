package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// limitInRedis reads the limit key as it stands, without running a script
// (a script would apply a due fall-back first).
func limitInRedis(t *testing.T, s *semaphore.Semaphore) int {
	t.Helper()
	n, ok, err := s.Limit(context.Background())
	if err != nil || !ok {
		t.Fatalf("Limit: %d, %v, %v", n, ok, err)
	}
	return n
}

func setAuto(t *testing.T, s *semaphore.Semaphore, a semaphore.AutoLimits) {
	t.Helper()
	if err := s.SetAuto(context.Background(), a); err != nil {
		t.Fatal(err)
	}
}

func setAdaptive(t *testing.T, s *semaphore.Semaphore, n int, hold time.Duration) int {
	t.Helper()
	got, err := s.SetAdaptive(context.Background(), n, hold, "test")
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestAutoModeKeepsTheLimitWithinItsBounds(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 40, Lease: time.Minute})
	ctx := context.Background()
	if err := s.SetLimit(ctx, 40); err != nil {
		t.Fatal(err)
	}
	// The operator's N as it stands, 40, is clamped into the bounds.
	setAuto(t, s, semaphore.AutoLimits{Min: 2, Max: 32})
	st := stats(t, s)
	if st.Limit != 32 || st.Auto.Mode != semaphore.ModeAuto || st.Auto.Min != 2 || st.Auto.Max != 32 || st.Auto.Fixed != 32 || st.Auto.Why != "operator" {
		t.Errorf("after SetAuto{2, 32} over a limit of 40: limit %d, %+v; want limit and fixed N 32, set by the operator", st.Limit, st.Auto)
	}
	for _, c := range []struct{ n, want int }{{100, 32}, {12, 12}, {0, 2}, {-5, 2}, {1, 2}, {32, 32}, {semaphore.MaxLimit + 1, 32}, {3, 3}} {
		if got := setAdaptive(t, s, c.n, time.Minute); got != c.want {
			t.Errorf("SetAdaptive(%d) = %d, want %d", c.n, got, c.want)
		}
		if got := limitInRedis(t, s); got != c.want {
			t.Errorf("after SetAdaptive(%d): the limit in Redis is %d, want %d", c.n, got, c.want)
		}
	}
	st = stats(t, s)
	if st.Limit != 3 || st.Auto.Controller != 3 || st.Auto.Why != "controller" || st.Auto.Reason != "test" ||
		st.Auto.HoldLeft <= 50*time.Second || st.Auto.HoldLeft > time.Minute {
		t.Errorf("after SetAdaptive(3, 1m): limit %d, %+v; want the controller's 3, holding about a minute", st.Limit, st.Auto)
	}
	// Narrower bounds clamp the fixed N again.
	setAuto(t, s, semaphore.AutoLimits{Min: 4, Max: 8, Fixed: 5})
	if st := stats(t, s); st.Limit != 5 || st.Auto.Fixed != 5 {
		t.Errorf("after SetAuto{4, 8, Fixed 5}: limit %d, fixed %d; want 5", st.Limit, st.Auto.Fixed)
	}
	if got := setAdaptive(t, s, 2, time.Minute); got != 4 {
		t.Errorf("SetAdaptive(2) within [4, 8] = %d, want 4", got)
	}
}

func TestSetAutoRefusesBadBoundsNamingTheFix(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 6})
	ctx := context.Background()
	if err := s.SetLimit(ctx, 6); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a    semaphore.AutoLimits
		want string
	}{
		{semaphore.AutoLimits{Min: 0, Max: 4}, "at least 1"},
		{semaphore.AutoLimits{Min: 5, Max: 4}, "max of at least the min"},
		{semaphore.AutoLimits{Min: 1, Max: semaphore.MaxLimit + 1}, "at most 1048576"},
		{semaphore.AutoLimits{Min: 2, Max: 4, Fixed: 5}, "within the bounds"},
	} {
		if err := s.SetAuto(ctx, c.a); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetAuto(%+v) = %v, want an error saying %q", c.a, err, c.want)
		}
	}
	if st := stats(t, s); st.Limit != 6 || st.Auto.Mode != semaphore.ModeFixed {
		t.Errorf("after refused SetAutos: limit %d, mode %s; want 6, fixed", st.Limit, st.Auto.Mode)
	}
	if _, err := s.SetAdaptive(ctx, 3, time.Minute, "test"); !errors.Is(err, semaphore.ErrNotAuto) || !strings.Contains(err.Error(), "SetAuto") {
		t.Errorf("SetAdaptive in fixed mode = %v, want ErrNotAuto naming SetAuto", err)
	}
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 8})
	if _, err := s.SetAdaptive(ctx, 3, 0, "test"); err == nil {
		t.Error("SetAdaptive with no hold succeeded")
	}
	// SetLimit returns to fixed mode.
	if err := s.SetLimit(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st.Limit != 7 || st.Auto.Mode != semaphore.ModeFixed {
		t.Errorf("after SetLimit(7) in auto mode: limit %d, mode %s; want 7, fixed", st.Limit, st.Auto.Mode)
	}
	if _, err := s.SetAdaptive(ctx, 3, time.Minute, "test"); !errors.Is(err, semaphore.ErrNotAuto) {
		t.Errorf("SetAdaptive after SetLimit = %v, want ErrNotAuto", err)
	}
	if got := limitInRedis(t, s); got != 7 {
		t.Errorf("limit %d after a refused SetAdaptive, want 7", got)
	}
}

// waitPast waits until Redis's clock has passed the controller's hold,
// set no earlier than set (read it once the move has returned).
func waitPast(t *testing.T, rdb redis.UniversalClient, hold time.Duration, set float64) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "the hold to pass", func() bool {
		return redisNowMs(t, rdb) > set+float64(hold.Milliseconds())+5
	})
}

func TestTheLimitFallsBackToTheFixedNOnceTheControllersHoldHasPassed(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	// A lease long enough that no watchdog refresh (which falls back too)
	// runs within the test: every fall-back is the call's the test makes.
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 4, Lease: 10 * time.Minute})
	ctx := context.Background()
	if err := s.SetLimit(ctx, 4); err != nil {
		t.Fatal(err)
	}
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 32})
	// While the controller's N holds, calls keep it.
	setAdaptive(t, s, 12, time.Minute)
	p := mustAcquire(t, s)
	if got := limitInRedis(t, s); got != 12 {
		t.Fatalf("limit %d while the controller's 12 holds", got)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The fall-back is applied by the first call past the hold: an
	// acquire, Stats, a release (each runs get_limit, as a refresh does).
	const hold = 300 * time.Millisecond
	var held []*semaphore.Permit
	for i := 0; i < 4; i++ {
		held = append(held, mustAcquire(t, s))
	}
	setAdaptive(t, s, 12, hold)
	set := redisNowMs(t, rdb)
	waitPast(t, rdb, hold, set)
	if got := limitInRedis(t, s); got != 12 {
		t.Fatalf("limit %d before any call after the hold, want 12 still (the scripts fall back, not a timer)", got)
	}
	// Four are held: under the fixed N, nothing is free.
	if q, err := s.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		if q != nil {
			_ = q.Release(ctx)
		}
		t.Fatalf("TryAcquire with 4 held after the hold passed = %v, want ErrNoPermit: the limit fell back to 4", err)
	}
	if got := limitInRedis(t, s); got != 4 {
		t.Errorf("after an acquire past the hold: limit %d, want the fixed 4", got)
	}
	st := stats(t, s)
	if st.Auto.Why != "fallback" || st.Auto.HoldLeft != 0 || st.Auto.Controller != 12 {
		t.Errorf("after the fall-back: %+v; want why fallback, no hold left, the controller's 12 on record", st.Auto)
	}

	// Stats alone applies it too.
	setAdaptive(t, s, 9, hold)
	set = redisNowMs(t, rdb)
	waitPast(t, rdb, hold, set)
	if st := stats(t, s); st.Limit != 4 || st.Auto.Why != "fallback" {
		t.Errorf("Stats past the hold: limit %d, why %q; want 4, fallback", st.Limit, st.Auto.Why)
	}

	// A release past the hold, which would hand its permit straight to
	// the queue's head under the controller's N (4 held of 4), falls back
	// first: with 3 held of a fixed 2, nobody is granted.
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 32, Fixed: 2})
	setAdaptive(t, s, 4, time.Hour)
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 4, Lease: 10 * time.Minute})
	got := acquireQueued(t, other, s, 1)
	setAdaptive(t, s, 4, hold)
	set = redisNowMs(t, rdb)
	waitPast(t, rdb, hold, set)
	if err := held[3].Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case q := <-got:
		t.Errorf("a waiter was granted with 3 held of a fixed 2: the release handed its permit on under the controller's lapsed N (%v)", q)
		if q != nil {
			_ = q.Release(ctx)
		}
	case <-time.After(200 * time.Millisecond):
	}
	if st := stats(t, s); st.Limit != 2 || st.Held != 3 || len(st.Waiters) != 1 {
		t.Errorf("after a release past the hold: limit %d, held %d, %d waiting; want 2, 3, 1", st.Limit, st.Held, len(st.Waiters))
	}
	for _, p := range held[:3] {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	q := receiveGrant(t, got, 5*time.Second, "the waiter, once fewer than 2 are held")
	_ = q.Release(ctx)

	// An acquire past the hold that would only queue behind the
	// controller's N (2 held of 2) falls back first, to a fixed 6 here,
	// and is granted at once.
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 32, Fixed: 6})
	setAdaptive(t, s, 2, time.Hour)
	two := []*semaphore.Permit{mustAcquire(t, s), mustAcquire(t, s)}
	setAdaptive(t, s, 2, hold)
	set = redisNowMs(t, rdb)
	waitPast(t, rdb, hold, set)
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := other.Acquire(actx)
	if err != nil {
		t.Fatalf("Acquire with 2 held past a hold of N 2, fixed 6: %v; want a grant at once", err)
	}
	for _, p := range append(two, r) {
		_ = p.Release(ctx)
	}
}

func TestAnAutoCutFailsNoQueuedRequestThatFitsUnderMaxAndGrantsNobodyUntilHeldIsBelowN(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 8, Lease: time.Minute})
	observer := newSem(t, rdb, prefix, semaphore.Options{Limit: 8, Lease: time.Minute})
	ctx := context.Background()
	if err := s.SetLimit(ctx, 8); err != nil {
		t.Fatal(err)
	}
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 16})
	setAdaptive(t, s, 8, time.Hour)
	var held []*semaphore.Permit
	for i := 0; i < 8; i++ {
		held = append(held, mustAcquire(t, s))
	}
	light := acquireNQueued(t, s, observer, 1, 1)
	heavy := acquireNQueued(t, s, observer, 8, 2)
	// The cut: 8 held, N 3.
	if got := setAdaptive(t, s, 3, time.Hour); got != 3 {
		t.Fatalf("SetAdaptive(3) = %d", got)
	}
	if st := stats(t, observer); st.Limit != 3 || st.Held != 8 || len(st.Waiters) != 2 {
		t.Fatalf("after the cut: limit %d, held %d, %d waiting; want 3, 8 (holders finish), 2 (nobody failed)", st.Limit, st.Held, len(st.Waiters))
	}
	// Above the limit but within max: not refused, only not free.
	if _, err := s.TryAcquireN(ctx, 10); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("TryAcquireN(10) under N 3, max 16 = %v, want ErrNoPermit, not ErrExceedsLimit", err)
	}
	if _, err := s.TryAcquireN(ctx, 17); !errors.Is(err, semaphore.ErrExceedsLimit) {
		t.Errorf("TryAcquireN(17) over max 16 = %v, want ErrExceedsLimit", err)
	}
	// Releases down to 3 held grant nobody.
	for len(held) > 3 {
		if err := held[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
		held = held[1:]
		if st := stats(t, observer); st.Held != len(held) || len(st.Waiters) != 2 {
			t.Fatalf("with %d held of N 3: held %d, %d waiting; want no grant", len(held), st.Held, len(st.Waiters))
		}
	}
	// Below 3, the light head is granted; the heavy one waits, not failed.
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	held = held[1:]
	held = append(held, receiveGrant(t, light, 5*time.Second, "the light waiter, once 2 are held of 3"))
	if st := stats(t, observer); st.Held != 3 || len(st.Waiters) != 1 || st.Waiters[0].Weight != 8 {
		t.Fatalf("after the light grant: held %d, waiters %+v; want 3 held, the heavy request queued", st.Held, st.Waiters)
	}
	// Below N, with the heavy request at the head: it waits, not failed,
	// and nobody behind it is granted.
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	held = held[1:]
	if st := stats(t, observer); st.Held != 2 || len(st.Waiters) != 1 || st.Waiters[0].Weight != 8 {
		t.Fatalf("2 held of N 3, the heavy request at the head: held %d, waiters %+v; want it still queued", st.Held, st.Waiters)
	}
	// The heavy request fits once the controller raises N and the holders
	// finish.
	setAdaptive(t, s, 8, time.Hour)
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	q := receiveGrant(t, heavy, 5*time.Second, "the heavy waiter, under N 8")
	if st := stats(t, observer); st.Held != 8 || len(st.Waiters) != 0 {
		t.Errorf("after the heavy grant: held %d, %d waiting; want 8, 0", st.Held, len(st.Waiters))
	}
	_ = q.Release(ctx)
}

func TestShadowModeNeverChangesTheLimit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 5, Lease: time.Minute})
	ctx := context.Background()
	if err := s.SetLimit(ctx, 5); err != nil {
		t.Fatal(err)
	}
	setAuto(t, s, semaphore.AutoLimits{Min: 2, Max: 32, Shadow: true})
	set := redisNowMs(t, rdb)
	const hold = 200 * time.Millisecond
	for _, c := range []struct{ n, recorded int }{{20, 20}, {1, 2}, {100, 32}} {
		if got := setAdaptive(t, s, c.n, hold); got != 5 {
			t.Errorf("SetAdaptive(%d) in shadow mode = %d, want the limit 5 unchanged", c.n, got)
		}
		st := stats(t, s)
		if st.Limit != 5 || st.Auto.Mode != semaphore.ModeShadow || st.Auto.Controller != c.recorded || st.Auto.Reason != "test" {
			t.Errorf("after SetAdaptive(%d) in shadow mode: limit %d, %+v; want 5, the controller's %d recorded", c.n, st.Limit, st.Auto, c.recorded)
		}
	}
	waitPast(t, rdb, hold, set)
	p := mustAcquire(t, s)
	_ = p.Release(ctx)
	if got := limitInRedis(t, s); got != 5 {
		t.Errorf("shadow mode, past the hold: limit %d, want 5", got)
	}
	// Heaviness is judged against the limit, which never moves.
	if _, err := s.TryAcquireN(ctx, 6); !errors.Is(err, semaphore.ErrExceedsLimit) {
		t.Errorf("TryAcquireN(6) under a shadow limit of 5 = %v, want ErrExceedsLimit", err)
	}
}
