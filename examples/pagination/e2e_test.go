package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// The whole product, end to end: three worker processes (cmd/worker) run
// orders-report over 100 000 orders with 3 database permits and a slow
// query per page; Postgres itself never sees more than 3 of their queries
// at once; one worker is killed with kill -9 mid-run, and the run still
// succeeds with the SQL-exact report; afterwards no permit is held; and no
// worker warns of a query without a permit: the example takes one for
// every query it makes, its split's CREATE TABLEs included.
func TestOrdersReportEndToEndUnderPermitsWithAWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("waits a minute for asynq to hand the killed worker's pages on")
	}
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	queue := testenv.JobQueue(t, rdb, prefix, ordersreport.Name)
	if err := ordersreport.Seed(ctx, pool, 100_000); err != nil {
		t.Fatal(err)
	}

	bin := testenv.Build(t, "../../cmd/worker")
	appName := "e2e-" + prefix[len(prefix)-8:]
	dbURL := testenv.DatabaseURLIn(t, schema)
	env := append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t), "DATABASE_URL="+dbURL,
		"BATCHMR_PREFIX="+prefix)
	var logs testenv.LogBuffer // every worker's warnings
	startWorker := func(i int) *exec.Cmd {
		cmd := exec.Command(bin, "--db-permits", "3", "--concurrency", "8", "--lease", "5s",
			"--application-name", appName, "--log-level", "warn")
		cmd.Env = env
		cmd.Stderr = io.MultiWriter(os.Stderr, &logs)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
		return cmd
	}
	workers := []*exec.Cmd{startWorker(1), startWorker(2), startWorker(3)}

	// Postgres's own count of the workers' queries running at once: those
	// that ran when the sample began, since Postgres reads pg_stat_activity
	// a backend at a time, and a read held up midway would also list a
	// query that took the place of one that ended meanwhile.
	var maxActive atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND state = 'active' AND query_start <= statement_timestamp()`, appName).Scan(&n); err == nil && n > maxActive.Load() {
				maxActive.Store(n)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	id, err := ordersreport.Job.Start(ctx, mr, ordersreport.Args{PageSize: 1000, SlowMS: 30}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Kill a worker once the run is well under way.
	var going *mapreduce.Status
	if !testenv.Eventually(60*time.Second, func() bool {
		var err error
		if going, err = mr.Status(ctx, id); err != nil {
			t.Fatal(err)
		}
		return going.Done >= 20 || going.State.Ended()
	}) || going.State.Ended() {
		t.Fatalf("the run did not get going: %+v", going)
	}
	if err := workers[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Logf("killed a worker at %s", killed.Format("15:04:05.000"))
	// asynq hands a dead worker's task on once its lease has been expired
	// for 30 s, at a worker's recoverer pass (at start, then each minute):
	// a replacement started then picks the pages up at once. The leases of
	// the tasks active at the kill: the live workers' end with their pages
	// or move on; the dead one's stay where the kill left them.
	leaseKey := "asynq:{" + queue + "}:lease"
	active, err := rdb.ZRange(ctx, leaseKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 90*time.Second, "the killed worker's leases to be expired for 30 s", func() bool {
		cutoff := float64(time.Now().Add(-30 * time.Second).Unix()) // asynq scores in unix seconds
		scores, err := rdb.ZMScore(ctx, leaseKey, active...).Result()
		if err != nil {
			return len(active) == 0
		}
		return !slices.ContainsFunc(scores, func(s float64) bool { return s >= cutoff }) // 0: gone
	})
	t.Logf("started a replacement %v after the kill", time.Since(killed).Round(time.Millisecond))
	startWorker(4)

	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	st, err := mr.Wait(wctx, id)
	close(stopSampling)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("run %s: %s (%s)", id, st.State, st.Error)
	}
	rep, err := ordersreport.Job.Result(st)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ordersreport.Expected(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Totals.Equal(want) || rep.Pages != 100 {
		t.Errorf("report %+v over %d pages, want %+v over 100", rep.Totals, rep.Pages, want)
	}
	if st.Expected != st.Total {
		t.Errorf("pgsource's split said to expect %d pages (ExpectPages) and emitted %d", st.Expected, st.Total)
	}
	var pageRows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM orders_report_pages WHERE run_id = $1", id).Scan(&pageRows); err != nil || pageRows != 100 {
		t.Errorf("%d per-page rows (%v), want 100: a retried page must overwrite its row", pageRows, err)
	}
	if m := maxActive.Load(); m > 3 || m == 0 {
		t.Errorf("Postgres saw up to %d worker queries at once, want 1..3 (the permits)", m)
	}
	t.Logf("most worker queries active at once: %d of 3 permits", maxActive.Load())
	if l := logs.String(); strings.Contains(l, "without a permit") {
		t.Errorf("a worker warned of a query without a permit: the example must take one for every query:\n%s", l)
	}
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 3, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	var stats semaphore.Stats
	if !testenv.Eventually(15*time.Second, func() bool { // the killed worker's lease is 5 s
		if stats, err = sem.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		return stats.Held == 0
	}) {
		t.Fatalf("permits still held after the run: %+v", stats)
	}
}
