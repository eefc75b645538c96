package pgsource_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
)

// The controller of auto mode, run as workers run it (with a Probe of the
// database), lowers N when Postgres loses its CPU, and when it dies the
// limit falls back to the operator's fixed N. What Postgres runs never
// exceeds the operator's max, and comes down with N: pg_stat_activity
// says so. Direction and bounds, not timing: make bench measures how fast
// and how well (internal/bench/adaptbench).
func TestTheControllerLowersNWhenPostgresLosesCPUAndFallsBackWhenItDies(t *testing.T) {
	t.Parallel()
	pg := testenv.PrivatePostgres(t)
	pg.LimitCPU(2)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	name := appName(t)
	pool, err := app.Postgres(ctx, pg.URL, name, 24, pgsource.ConfigurePool)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 8, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	const lo, hi, fixed = 1, 16, 8
	if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: lo, Max: hi, Fixed: fixed}); err != nil {
		t.Fatal(err)
	}

	// Pages whose query waits 20ms (I/O, say) and burns ~5ms of CPU:
	// room for ~10 at once on 2 cores, for 1 on a tenth of a core.
	stopLoad := testenv.Loop(t, 20, func(ctx context.Context) {
		_ = pgsource.Do(ctx, pool, sem, func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SELECT pg_sleep(0.02), (SELECT count(*) FROM generate_series(1, 40000))")
			return err
		})
	})
	defer stopLoad() // before the pool and the semaphore close
	probe := pgsource.NewProbe(pool)
	defer probe.Close()
	ctlCtx, stopCtl := context.WithCancel(ctx)
	defer stopCtl()
	ctlDone := make(chan struct{})
	go func() {
		defer close(ctlDone)
		_ = sem.RunController(ctlCtx, semaphore.ControllerOptions{Window: 250 * time.Millisecond, Probe: probe.Run,
			Logger: slog.New(slog.DiscardHandler)})
	}()
	watch := watchActivityOn(t, pg.URL, name)

	// Full capacity: the controller takes over and settles somewhere.
	testenv.WaitFor(t, 30*time.Second, "the controller to set N", func() bool {
		st, err := sem.Stats(ctx)
		return err == nil && st.Auto.Why == "controller" && st.Auto.Signals.OK > 0
	})
	full := limitsOver(t, sem, 3*time.Second)
	high := slices.Max(full)
	if high < 3 {
		t.Skipf("at full capacity the controller kept N at %v: this machine's Postgres has too little CPU to spare for the drop to show", full)
	}

	pg.LimitCPU(0.1)
	testenv.WaitFor(t, 60*time.Second, "the controller to bring N down to half what it was", func() bool {
		st, err := sem.Stats(ctx)
		return err == nil && st.Limit*2 <= high
	})
	low := limitsOver(t, sem, 2*time.Second)
	if m := slices.Max(low); m*2 > high {
		t.Errorf("with a tenth of a core, N was %v; at full capacity %v: want it down and staying down", low, full)
	}
	t.Logf("N at full capacity %v, with a tenth of a core %v", full, low)
	most := watch.most.Swap(0)
	time.Sleep(time.Second) // a second of sampling at the low N
	if seen := int(watch.most.Load()); seen > slices.Max(low) {
		t.Errorf("Postgres ran %d of the workers' queries at once, N being %v", seen, low)
	}

	stopCtl()
	<-ctlDone
	testenv.WaitFor(t, 30*time.Second, "the limit to fall back to the fixed N", func() bool {
		st, err := sem.Stats(ctx)
		return err == nil && st.Limit == fixed && st.Auto.Why == "fallback"
	})
	if most = max(most, int64(watch.close())); most > hi {
		t.Errorf("Postgres ran %d of the workers' queries at once; max is %d", most, hi)
	}
}

// limitsOver samples sem's limit every 100ms for d.
func limitsOver(t *testing.T, sem *semaphore.Semaphore, d time.Duration) []int {
	t.Helper()
	var ns []int
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st, err := sem.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ns = append(ns, st.Limit)
	}
	return ns
}
