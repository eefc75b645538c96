package semaphore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// pgError is an error with a Postgres SQLSTATE, as pgconn.PgError has.
type pgError string

func (e pgError) Error() string    { return "ERROR: SQLSTATE " + string(e) }
func (e pgError) SQLState() string { return string(e) }

// signals reads the counters releases add to (scripts/lib.lua, report).
func signals(t *testing.T, rdb redis.UniversalClient, prefix string) map[string]int {
	t.Helper()
	m, err := rdb.HGetAll(context.Background(), prefix+":{db}:signals").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for k, v := range m {
		if n, err := strconv.Atoi(v); err == nil {
			out[k] = n
		}
	}
	return out
}

// A release carries what its holder reported, counted once per permit and
// only in auto or shadow mode: a success with its time, a timeout as
// overload, another error as an error, a cancel as time alone.
func TestReleasesReportHowTheirWorkEndedInAutoModeOnly(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
	ctx := context.Background()
	p := mustAcquire(t, s)
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := signals(t, rdb, prefix); len(got) != 0 {
		t.Fatalf("fixed mode: a release left signals %v, want none", got)
	}
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 8})
	for _, err := range []error{nil, nil, context.DeadlineExceeded, pgError("57014"), pgError("53300"),
		errors.New("syntax error"), pgError("42601"), context.Canceled} {
		p := mustAcquire(t, s)
		time.Sleep(20 * time.Millisecond) // the work the permit guards
		p.Report(err)
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// Released again: not held, nothing more to count.
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
			t.Fatalf("a second Release = %v, want ErrNotHeld", err)
		}
	}
	got := signals(t, rdb, prefix)
	if got["n"] != 2 || got["over"] != 3 || got["err"] != 2 || got["okms"] < 40 || got["busy"] < 8*20 || got["busy"] > 8*20+2000 {
		t.Errorf("signals %v; want n 2 (okms ≥ 40), over 3, err 2, busy ≥ 160ms over the 8 releases", got)
	}
}

// One controller leads at a time, elected through Redis: a candidate that
// stops loses the lease, another takes over with a new epoch, and the
// former controller's moves are refused.
func TestOneControllerLeadsAndAnotherTakesOverWithANewEpoch(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	a := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
	b := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
	setAuto(t, a, semaphore.AutoLimits{Min: 1, Max: 8, Fixed: 4})
	ctx := context.Background()
	load(t, a, 4, 5*time.Millisecond)
	window := 100 * time.Millisecond
	ctxA, stopA := context.WithCancel(ctx)
	doneA := runController(a, ctxA, window)
	lease := func() string { v, _ := rdb.Get(ctx, prefix+":{db}:control").Result(); return v }
	testenv.WaitFor(t, 5*time.Second, "a controller to lead and set N", func() bool {
		st := stats(t, a)
		return lease() != "" && st.Auto.Signals.Epoch == 1 && st.Auto.Why == "controller"
	})
	first := lease()
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	doneB := runController(b, ctxB, window)
	// B campaigns every window, and loses while A leads.
	time.Sleep(5 * window)
	if lease() != first {
		t.Fatalf("the lease moved from %q to %q while its holder ran", first, lease())
	}
	stopA()
	<-doneA
	testenv.WaitFor(t, 5*time.Second, "the other candidate to take over with epoch 2", func() bool {
		st := stats(t, a)
		return lease() != first && st.Auto.Signals.Epoch == 2
	})
	if _, err := a.AdaptAs(ctx, first, 7); err == nil {
		t.Error("a move under the former controller's lease was taken; want it refused")
	}
	stopB()
	<-doneB
}

// When the controller stops, or the releases stop reporting, its N holds
// for its window and the limit falls back to the operator's fixed N; when
// Redis loses the auto mode while it leads, it sets it again, with its N.
func TestWithoutItsControllerTheLimitFallsBackToTheFixedN(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.PrivateRedis(t)
	s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 6, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 8, Fixed: 6, Window: 200 * time.Millisecond})
	// Elections before this one: its lease is not the first.
	if err := rdb.HSet(context.Background(), semaphore.DefaultPrefix+":{db}:signals", "epoch", 5).Err(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stopLoad := load(t, s, 8, 5*time.Millisecond)
	window := 100 * time.Millisecond
	done := runController(s, ctx, window)
	testenv.WaitFor(t, 10*time.Second, "the controller to move N off the fixed 6", func() bool {
		st := stats(t, s)
		return st.Auto.Why == "controller" && st.Limit != 6
	})
	// Redis loses every key, as a restart without persistence does.
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the controller to set the auto mode again", func() bool {
		st := stats(t, s)
		return st.Auto.Mode == semaphore.ModeAuto && st.Auto.Min == 1 && st.Auto.Max == 8 && st.Auto.Fixed == 6 &&
			st.Auto.Window == 200*time.Millisecond
	})
	testenv.WaitFor(t, 10*time.Second, "the controller to move N off the fixed 6 again", func() bool {
		st := stats(t, s)
		return st.Auto.Why == "controller" && st.Limit != 6
	})
	// No release reports: the controller, running, lets N fall back.
	stopLoad()
	testenv.WaitFor(t, 10*time.Second, "the limit to fall back to the fixed 6 without signals", func() bool {
		st := stats(t, s)
		return st.Limit == 6 && st.Auto.Why == "fallback"
	})
	load(t, s, 8, 5*time.Millisecond)
	testenv.WaitFor(t, 10*time.Second, "the controller to move N once reports come again", func() bool {
		st := stats(t, s)
		return st.Auto.Why == "controller" && st.Limit != 6
	})
	stop()
	<-done
	testenv.WaitFor(t, 10*time.Second, "the limit to fall back to the fixed 6", func() bool {
		st := stats(t, s)
		return st.Limit == 6 && st.Auto.Why == "fallback"
	})
	// SetLimit ends auto mode for good: no controller brings it back.
	if err := s.SetLimit(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithCancel(context.Background())
	done2 := runController(s, ctx2, window)
	time.Sleep(10 * window)
	stop2()
	<-done2
	if st := stats(t, s); st.Auto.Mode != semaphore.ModeFixed || st.Limit != 3 {
		t.Errorf("after SetLimit(3) and ten windows of a controller: %+v, limit %d; want fixed 3", st.Auto, st.Limit)
	}
	// In fixed mode there is nothing to control: nobody holds the lease.
	if n, err := rdb.Exists(context.Background(), semaphore.DefaultPrefix+":{db}:control").Result(); err != nil || n != 0 {
		t.Errorf("in fixed mode a controller's lease exists (%d, %v); want none", n, err)
	}
}

// runController runs s's controller with window until ctx is done; the
// channel closes when it returned.
func runController(s *semaphore.Semaphore, ctx context.Context, window time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.RunController(ctx, semaphore.ControllerOptions{Window: window, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	return done
}

// load runs n goroutines that each hold a permit of s for hold, again
// and again, reporting success, until the test ends or stop is called.
func load(t *testing.T, s *semaphore.Semaphore, n int, hold time.Duration) (stop func()) {
	t.Helper()
	return testenv.Loop(t, n, func(ctx context.Context) {
		_ = s.Do(ctx, func(context.Context) error {
			time.Sleep(hold)
			return nil
		})
	})
}

// The controller runs on every Redis topology: on a Cluster its lease,
// signals and mode share the semaphore's slot; through Sentinels it
// reaches the primary. Two candidates, one controller, N moved from the
// releases' reports.
func TestTheControllerRunsOnRedisClusterAndThroughSentinels(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name string
		open func(t *testing.T) (redis.UniversalClient, string)
	}{
		{"cluster", func(t *testing.T) (redis.UniversalClient, string) { return testenv.RedisCluster(t) }},
		{"sentinel", func(t *testing.T) (redis.UniversalClient, string) { return testenv.RedisSentinel(t) }},
	} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			rdb, prefix := topo.open(t)
			a := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
			b := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
			setAuto(t, a, semaphore.AutoLimits{Min: 1, Max: 8, Fixed: 4})
			load(t, a, 2, 5*time.Millisecond)
			load(t, b, 2, 5*time.Millisecond)
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			doneA := runController(a, ctx, 100*time.Millisecond)
			doneB := runController(b, ctx, 100*time.Millisecond)
			testenv.WaitFor(t, 20*time.Second, "the controller to move N from both handles' reports", func() bool {
				st := stats(t, b)
				return st.Auto.Why == "controller" && st.Auto.Signals.Epoch == 1 && st.Auto.Signals.OK > 0
			})
			if c, ok := rdb.(*redis.ClusterClient); ok {
				k := prefix + ":{db}:"
				testenv.KeysInOneSlot(t, c, prefix, 6, k+"control", k+"signals", k+"auto", k+"limit")
			}
			stop()
			<-doneA
			<-doneB
		})
	}
}

// The operator's window sets every controller's pace, whatever its own
// default; a window out of bounds is refused naming them.
func TestTheOperatorsWindowSetsTheControllersPace(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
	ctx := context.Background()
	err := s.SetAuto(ctx, semaphore.AutoLimits{Min: 1, Max: 8, Window: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "from 100ms to 10m0s") {
		t.Fatalf("SetAuto with a 50ms window = %v; want it refused naming the bounds", err)
	}
	setAuto(t, s, semaphore.AutoLimits{Min: 1, Max: 8, Fixed: 4, Window: 400 * time.Millisecond})
	if st := stats(t, s); st.Auto.Window != 400*time.Millisecond {
		t.Fatalf("Stats.Auto.Window = %v, want the 400ms set", st.Auto.Window)
	}
	load(t, s, 4, 5*time.Millisecond)
	ctx2, stop := context.WithCancel(ctx)
	done := runController(s, ctx2, 100*time.Millisecond)
	defer func() { stop(); <-done }()
	testenv.WaitFor(t, 20*time.Second, "a window of the controller's", func() bool {
		return stats(t, s).Auto.Signals.Epoch > 0
	})
	if w := stats(t, s).Auto.Signals.Window; w < 350*time.Millisecond || w > 2*time.Second {
		t.Errorf("the controller's window spanned %v; want about the operator's 400ms, not its own 100ms", w)
	}
}
