package worker_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/jackc/pgx/v5"
)

// proc is a worker process whose stderr the test reads.
type proc struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	log strings.Builder
	eof chan struct{} // closed once stderr is read to its end
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func startProc(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), eof: make(chan struct{})}
	p.cmd.Env = env
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.eof)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
	return p
}

// Two worker binaries with different jobs share one Redis and one
// deployment prefix: each serves only its own job's queue, both runs
// succeed with the exact result, no task ever reaches the other binary
// (nothing is handed back), and the catalogue lists each job with its own
// worker. Before per-job queues, each failed the other's runs.
func TestTwoWorkerBinariesWithDifferentJobsRunBothJobsAtOnceExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, ordersreport.Name)
	testenv.JobQueue(t, rdb, prefix, "squares")
	if err := ordersreport.Seed(ctx, pool, 30_000); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t), "BATCHMR_PREFIX="+prefix)
	orders := startProc(t, testenv.Build(t, "../../cmd/worker"), append(env, "DATABASE_URL="+testenv.DatabaseURLIn(t, schema)),
		"--db-permits", "2", "--concurrency", "4", "--poll-interval", "20ms", "--log-level", "info")
	// squares sets an Observer by MainWith (SQUARES_TRACE), its flags
	// still read.
	squares := startProc(t, testenv.Build(t, "./testdata/squares"), append(env, "SQUARES_TRACE=1"),
		"--permits", "cpu=2", "--concurrency", "4", "--poll-interval", "20ms", "--log-level", "info")

	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	var jobs []mapreduce.JobInfo
	announced := false
	defer func() {
		if !announced {
			t.Logf("catalogue: %+v\norders: %s\nsquares: %s", jobs, orders.output(), squares.output())
		}
	}()
	testenv.WaitFor(t, 20*time.Second, "the two workers to announce their jobs", func() bool {
		var err error
		jobs, err = mr.Jobs(ctx)
		return err == nil && len(jobs) == 2 && len(jobs[0].Workers) == 1 && len(jobs[1].Workers) == 1
	})
	announced = true
	if jobs[0].Name != ordersreport.Name || jobs[1].Name != "squares" || jobs[0].Workers[0].ID == jobs[1].Workers[0].ID {
		t.Fatalf("catalogue: %+v; want each job hosted by its own worker", jobs)
	}
	if got := jobs[1].Workers[0].Semaphores; len(got) != 1 || got[0] != "cpu" {
		t.Errorf("the squares worker announces semaphores %v, want [cpu]", got)
	}
	// With no --version-label, a worker shows the batchmr it was built
	// with, so that an operator sees a fleet mid-upgrade.
	if got := jobs[0].Workers[0].Version; !strings.HasPrefix(got, "batchmr ") {
		t.Errorf("a worker with no --version-label announces version %q, want its batchmr version", got)
	}

	// Both at once, each of many pages.
	ordersRun, err := ordersreport.Job.Start(ctx, mr, ordersreport.Args{PageSize: 500, SlowMS: 5}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	squaresRun, err := mr.StartJSON(ctx, "squares", []byte(`{"n": 20000, "page_size": 250}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := mr.Wait(wctx, ordersRun)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ordersreport.Job.Result(st)
	if err != nil {
		t.Fatalf("orders-report: %v\n%s", err, orders.output())
	}
	want, err := ordersreport.Expected(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Totals.Equal(want) || rep.Pages != 60 {
		t.Errorf("orders-report %+v over %d pages, want %+v over 60", rep.Totals, rep.Pages, want)
	}
	st, err = mr.Wait(wctx, squaresRun)
	if err != nil {
		t.Fatal(err)
	}
	wantSquares := 0
	for i := range 20000 {
		wantSquares += i * i
	}
	if st.State != mapreduce.StateSucceeded || string(st.Result) != strconv.Itoa(wantSquares) || st.Total != 80 {
		t.Errorf("squares: %s %q = %s over %d pages, want %d over 80\n%s", st.State, st.Error, st.Result, st.Total, wantSquares, squares.output())
	}
	for name, p := range map[string]*proc{"orders": orders, "squares": squares} {
		if out := p.output(); strings.Contains(out, "handed back") || strings.Contains(out, "level=ERROR") {
			t.Errorf("the %s worker saw another job's task, or an error:\n%s", name, out)
		}
	}
	// SIGTERM: each exits 0 and withdraws from the catalogue.
	for name, p := range map[string]*proc{"orders": orders, "squares": squares} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("the %s worker after SIGTERM: %v, want exit 0\n%s", name, err, p.output())
		}
	}
	// Every step of the squares run reached the Observer MainWith set
	// (its split, its 80 pages and its reduce succeeded; a step asynq
	// delivered again may show twice), and MainWith returned after the
	// clean shutdown: the worker exited 0 above.
	for kind, n := range map[string]int{"split": 1, "map": 80, "reduce": 1} {
		if got := strings.Count(squares.output(), "squares: step "+kind+" ended: <nil>\n"); got < n {
			t.Errorf("the squares worker's Observer saw %d %s steps succeed, want at least %d", got, kind, n)
		}
	}
	if ws, err := mr.Workers(ctx); err != nil || len(ws) != 0 {
		t.Errorf("workers after both stopped: %+v, %v; want none", ws, err)
	}
	sem, err := semaphore.New(rdb, "cpu", semaphore.Options{Limit: 1, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	if st, err := sem.Stats(ctx); err != nil || st.Limit != 2 || st.Held != 0 {
		t.Errorf("semaphore cpu after the run: %+v, %v; want limit 2 from --permits, none held", st, err)
	}
}

// A job's functions get what they need from the worker's context, and a
// clear error, naming the fix, anywhere else.
func TestJobsGetTheirDatabaseAndSemaphoresFromTheWorkersContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, _, err := worker.Database(ctx); err == nil || !strings.Contains(err.Error(), "worker.NewContext") {
		t.Errorf("Database outside a worker: %v", err)
	}
	if _, err := worker.Semaphore(ctx, "db"); err == nil || !strings.Contains(err.Error(), "not called from a job") {
		t.Errorf("Semaphore outside a worker: %v", err)
	}
	if worker.Logger(ctx) == nil {
		t.Error("Logger outside a worker is nil, want slog.Default()")
	}
	rdb, prefix := testenv.Redis(t)
	cpu, err := semaphore.New(rdb, "cpu", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	wctx := worker.NewContext(ctx, &worker.Env{Redis: rdb, Semaphores: map[string]*semaphore.Semaphore{"cpu": cpu}})
	if _, _, err := worker.Database(wctx); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("Database in a worker without one: %v", err)
	}
	if s, err := worker.Semaphore(wctx, "cpu"); err != nil || s != cpu {
		t.Errorf("Semaphore(cpu): %v, %v", s, err)
	}
	if _, err := worker.Semaphore(wctx, "gpu"); err == nil || !strings.Contains(err.Error(), "it has: cpu") || !strings.Contains(err.Error(), "--permits gpu=N") {
		t.Errorf("an unopened semaphore: %v", err)
	}
	pool, _ := testenv.Postgres(t)
	wctx = worker.NewContext(ctx, &worker.Env{DB: pool})
	if _, _, err := worker.Database(wctx); err == nil || !strings.Contains(err.Error(), `no semaphore "db"`) {
		t.Errorf("Database without its semaphore: %v", err)
	}
}

// Run is the library form of Main: it returns errors instead of exiting,
// and shuts down cleanly when its context ends, withdrawing its jobs.
func TestRunRefusesBadConfigsAndStopsCleanlyWithItsContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, ordersreport.Name)
	good := worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix}
	for _, tc := range []struct {
		cfg  func(worker.Config) worker.Config
		jobs []mapreduce.AnyJob
		want string
	}{
		{func(c worker.Config) worker.Config { c.RedisURL = ""; return c }, []mapreduce.AnyJob{ordersreport.Job}, "REDIS_URL"},
		{func(c worker.Config) worker.Config { return c }, nil, "no jobs"},
		{func(c worker.Config) worker.Config { return c }, []mapreduce.AnyJob{ordersreport.Job, ordersreport.Job}, "already registered"},
		{func(c worker.Config) worker.Config { c.ReconcileEvery = -time.Second; return c }, []mapreduce.AnyJob{ordersreport.Job}, "--reconcile-every -1s is negative"},
		{func(c worker.Config) worker.Config { c.Permits = map[string]int{"db": 0}; return c }, []mapreduce.AnyJob{ordersreport.Job}, "--db-permits 0"},
		{func(c worker.Config) worker.Config { c.Permits = map[string]int{"db": 1<<20 + 1}; return c }, []mapreduce.AnyJob{ordersreport.Job}, "--db-permits 1048577: a semaphore needs at least 1 permit and takes at most 1048576"},
		{func(c worker.Config) worker.Config { c.Weights = map[string]int{"nope": 2}; return c }, []mapreduce.AnyJob{ordersreport.Job}, `"nope"`},
		{func(c worker.Config) worker.Config { c.RedisURL = "redis://127.0.0.1:1/0"; return c }, []mapreduce.AnyJob{ordersreport.Job}, "cannot reach the Redis server"},
		{func(c worker.Config) worker.Config { c.RequireDatabase = true; return c }, []mapreduce.AnyJob{ordersreport.Job}, "no database: pass --database-url"},
	} {
		if err := worker.Run(ctx, tc.cfg(good), tc.jobs...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run: %v; want an error saying %q", err, tc.want)
		}
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(rctx, good, ordersreport.Job) }()
	testenv.WaitFor(t, 10*time.Second, "Run to announce its worker", func() bool {
		ws, _ := mr.Workers(ctx)
		return len(ws) == 1
	})
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after its context ended: %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if ws, _ := mr.Workers(ctx); len(ws) != 0 {
		t.Errorf("workers after Run returned: %+v, want none", ws)
	}
}

// A worker started without a database fails no page of a job that needs
// one: its worker.Database error hands the page back, spending no retry
// (here the job has none), and a worker with a database runs it.
func TestAWorkerWithoutADatabaseLeavesItsPagesToOnesThatHaveOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	const name = "needs-db"
	testenv.JobQueue(t, rdb, prefix, name)
	// No retries of either kind: only a hand-back keeps a page alive.
	job := pagesJob(name, func(ctx context.Context, p int) (int, error) {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return 0, err
		}
		got, err := pgsource.Fetch(ctx, db, sem, "SELECT $1::int + $2::int", pgsource.KeyRange{Lo: int64(p), Hi: 0}, pgx.RowTo[int32])
		if err != nil {
			return 0, err
		}
		return int(got[0]), nil
	}, mapreduce.JobOptions{MapRetries: -1, TransientRetries: -1})
	run := func(cfg worker.Config) {
		wctx, stop := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- worker.Run(wctx, cfg, job) }()
		t.Cleanup(func() {
			stop()
			if err := <-stopped; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	// The worker without a database polls an empty queue every 500 ms,
	// the one with a database every 20 ms: a page handed back goes to
	// whichever polls first once it is due again, and at even odds the
	// last of 20 pages could bounce back a dozen times (5 s each) before
	// the worker with a database takes it.
	cfg := worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix, Concurrency: 2, PollInterval: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	run(cfg) // no database: it starts with a warning
	mr := mustClient(t, rdb, prefix)
	id, err := job.Start(ctx, mr, 20, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "a page's attempt on the worker without a database", func() bool {
		st, err := mr.Status(ctx, id)
		return err == nil && strings.Contains(st.LastError.Error, "has no database")
	})
	cfg.DatabaseURL, cfg.PollInterval = testenv.DatabaseURL(t), 20*time.Millisecond
	run(cfg)
	wait, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := mr.Wait(wait, id)
	if err != nil || st.State != mapreduce.StateSucceeded || st.Failed != 0 {
		t.Fatalf("run %s: %+v, %v; want succeeded with no failed page", id, st, err)
	}
	if got, err := job.Result(st); err != nil || got != 190 {
		t.Errorf("result %d, %v; want 190 (0 + … + 19)", got, err)
	}
}
