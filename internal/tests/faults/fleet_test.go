//go:build linux

package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The deployment every scenario runs: the suite's worker binary
// (testdata/sumworker) with its job "sums", under the default prefix, on
// servers of the test's own.
const (
	permits = 3 // --db-permits of every worker
	workers = 3
	job     = "sums"
	prefix  = "batchmr"
	queue   = prefix + ":" + job // the job's asynq queue
)

// The bounds of the issue "Outages cost seconds, not runs", each with the
// requirement it checks; assertion messages quote them.
const (
	// After Redis is back, work resumes within 2 s.
	redisResume    = 2 * time.Second
	reqRedisResume = "after Redis is back, work resumes within 2 s"
	// An outage costs at most its length plus 10 s ("an 8 s cut costs at
	// most the cut plus 10 s"): the run takes at most the baseline run's
	// time, plus the outage, plus 10 s.
	outageCost    = 10 * time.Second
	reqOutageCost = "an outage costs at most its length plus 10 s"
	// After the database is back, work resumes within seconds (DESIGN M6):
	// 10 s leaves room for a retry backoff capped at a few seconds. The
	// outage then costs at most its length, the resumption and 10 s.
	dbResume    = 10 * time.Second
	reqDBResume = "after the database is back, work resumes within 10 s"
	reqDBCost   = "a database outage costs at most its length plus 20 s"
	// Postgres never sees more worker queries than permits.
	reqPermits = "Postgres never sees more worker queries than permits"
	// No permit outlives the run: a leaked one would stay taken until its
	// lease (30 s) ran out.
	permitsFree    = 2 * time.Second
	reqPermitsFree = "no permit is held once the run has ended"
)

// serverFault is what taking a server away from the workers may cost.
type serverFault struct {
	server    string        // the server, for the log
	resume    time.Duration // work resumes within resume of its return
	resumeReq string
	cost      time.Duration // the run costs at most the outage plus cost
	costReq   string
}

var (
	redisFault    = serverFault{"Redis", redisResume, reqRedisResume, outageCost, reqOutageCost}
	databaseFault = serverFault{"Postgres", dbResume, reqDBResume, dbResume + outageCost, reqDBCost}
)

// aRun is a run a scenario starts: its job, its arguments (JSON) and
// the exact result it must end with.
type aRun interface {
	job() string
	pages(f *fleet) int
	want(f *fleet) result
	String() string // for the log: "400 pages of 20 ms"
}

// runArgs are the arguments of a run of "sums".
type runArgs struct {
	PageSize int `json:"page_size"`
	SleepMS  int `json:"sleep_ms"`
	Queries  int `json:"queries,omitempty"` // a page's queries, each under a permit of its own; 0 is 1
}

func (a runArgs) job() string { return job }

// pages is how many pages a run with a splits the table into.
func (a runArgs) pages(f *fleet) int {
	return int((f.rows + int64(a.PageSize) - 1) / int64(a.PageSize))
}

// want is the table's total, by SQL, over a's pages.
func (a runArgs) want(f *fleet) result {
	w := f.want
	w.Pages = a.pages(f)
	return w
}

func (a runArgs) String() string {
	queries := fmt.Sprintf("%d ms each", a.SleepMS)
	if a.Queries > 1 {
		queries = fmt.Sprintf("%d queries of %d ms each, a permit each", a.Queries, a.SleepMS)
	}
	return fmt.Sprintf("a run of sums (pages of %d rows, %s; exact: SELECT count(*), sum(amount) FROM amounts)", a.PageSize, queries)
}

// result is a run's result, and the table's total.
type result struct {
	Rows  int64 `json:"rows"`
	Sum   int64 `json:"sum"`
	Pages int   `json:"pages"`
}

// fleetConfig varies a scenario's deployment.
type fleetConfig struct {
	// Lease is the workers' --lease; zero leaves their default (30 s).
	Lease time.Duration
	// Proxy makes the workers reach Redis through a testenv.Proxy, which
	// the test can cut or blackhole; the test's own clients never go
	// through it.
	Proxy bool
	// Sentinel deploys Redis as testenv.PrivateSentinels does (a primary,
	// a replica, three Sentinels) instead of one server with AOF; the
	// workers and the test's own clients get the Sentinel URL, and
	// f.redis is the primary, which the test can kill.
	Sentinel bool
	// Cluster deploys Redis as testenv.PrivateRedisClusterGroup does
	// (three primaries, a replica of each, cluster-node-timeout 1 s),
	// the job's records and the "db" semaphore on the first primary and
	// the job's asynq queue on the second (clusterTags); the workers and
	// the test's own clients get the Cluster URL, and f.cluster's nodes
	// are what the test can kill. f.redis is nil.
	Cluster bool
	// JSONLogs makes the workers log JSON (--log-format json), for a test
	// that reads their records.
	JSONLogs bool
}

// fleet is one scenario's deployment: a Redis with AOF and a Postgres of
// the test's own, a table of amounts, three workers, a sampler of what
// Postgres runs, and the test's own clients, which reach Redis directly.
type fleet struct {
	t       *testing.T
	redis   *testenv.RedisServer   // the server the workers write to (Sentinel: the first primary; Cluster: nil)
	group   *testenv.SentinelGroup // nil unless cfg.Sentinel
	cluster *testenv.ClusterGroup  // nil unless cfg.Cluster
	rdb     redis.UniversalClient  // the test's own client of Redis, whatever its form
	pg      *testenv.PostgresServer
	proxy   *testenv.Proxy // nil unless cfg.Proxy
	env     []string       // the workers' environment
	args    []string       // the workers' flags
	bin     string         // the worker binary
	app     string         // the workers' application_name
	rows    int64          // rows of amounts
	want    result         // the table's total, by SQL
	mr      *mapreduce.Client
	sem     *semaphore.Semaphore // a handle on the workers' "db" semaphore, for Stats
	workers []*workerProc
	sampler *sampler
	// timeline is the run's progress after the fault, shown on failure.
	timeline testenv.LogBuffer
}

// quiet logs the test's own clients' errors only.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// defaultPages is how many pages a run has: enough for a fault to land
// mid-run with most of the run after it, few enough to keep the suite
// within minutes. BATCHMR_CHAOS_PAGES sets it for soak runs (make chaos).
func defaultPages(t *testing.T) int {
	return envInt(t, "BATCHMR_CHAOS_PAGES", 400)
}

// rowsPerPage is the page size of the default run.
const rowsPerPage = 100

// defaultRun is a run of defaultPages pages of 20 ms, as the campaign's.
func defaultRun() runArgs { return runArgs{PageSize: rowsPerPage, SleepMS: 20} }

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: use a positive number", name, v)
	}
	return n
}

// newFleet starts a scenario's deployment and returns once every worker
// has announced the job.
func newFleet(t *testing.T, cfg fleetConfig) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("a fault scenario takes seconds to minutes: run it without -short (make test, make chaos)")
	}
	ctx := context.Background()
	f := &fleet{t: t, rows: int64(defaultPages(t) * rowsPerPage)}
	p := testenv.Prefix(t) // ends in random hex
	f.app = "faults-" + p[len(p)-8:]
	var redisURL string
	switch {
	case cfg.Sentinel:
		f.group = testenv.PrivateSentinels(t, testenv.SentinelOptions{DownAfter: time.Second})
		f.redis, redisURL = f.group.Primary, f.group.URL
		f.rdb = appRedis(t, redisURL)
	case cfg.Cluster:
		f.cluster = testenv.PrivateRedisClusterGroup(t, testenv.ClusterGroupOptions{NodeTimeout: time.Second, Tags: clusterTags})
		redisURL = f.cluster.URL
		f.rdb = appRedis(t, redisURL)
	default:
		// AOF, as docs/operations.md asks of production.
		f.redis = testenv.PrivateRedisServer(t, "--appendonly", "yes", "--appendfsync", "everysec")
		f.rdb, redisURL = f.redis.Client, f.redis.URL
	}
	f.pg = testenv.PrivatePostgres(t)
	f.seed(ctx)
	f.sampler = startSampler(t, f.pg.URL, f.app)

	if cfg.Proxy {
		f.proxy, redisURL = testenv.RedisProxy(t, redisURL)
	}
	f.env = append(os.Environ(), "REDIS_URL="+redisURL, "DATABASE_URL="+f.pg.URL, "BATCHMR_PREFIX="+prefix)
	f.args = []string{"--db-permits", strconv.Itoa(permits), "--application-name", f.app, "--log-level", "info"}
	if cfg.Lease > 0 {
		f.args = append(f.args, "--lease", cfg.Lease.String())
	}
	if cfg.JSONLogs {
		f.args = append(f.args, "--log-format", "json")
	}
	f.bin = workerBinary(t)
	for range workers {
		f.startWorker()
	}

	var err error
	if f.mr, err = mapreduce.New(f.rdb, mapreduce.Config{Prefix: prefix, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if f.sem, err = semaphore.New(f.rdb, "db", semaphore.Options{Limit: permits, Prefix: prefix + ":sem", Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.sem.Close() })
	f.sampler.explainOver(permits, f.semaphoreNow)
	t.Cleanup(f.dumpLogsOnFailure)
	var last string
	if !testenv.Eventually(30*time.Second, func() bool {
		info, err := f.mr.Job(ctx, job)
		last = fmt.Sprintf("%+v, %v", info, err)
		return err == nil && len(info.Workers) == workers
	}) {
		t.Fatalf("the %d workers did not announce %q within 30s: %s", workers, job, last)
	}
	return f
}

// clusterTags place, on a fleet's Cluster, the job's records (hash tag
// the job's name) and the "db" semaphore's keys on the first primary, and
// the job's asynq queue (asynq:{queue}:...) on the second.
var clusterTags = [3][]string{{job, "db"}, {queue}, nil}

// appRedis is a client of url as the workers make theirs (app.Redis),
// closed when the test ends.
func appRedis(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	rdb, err := app.Redis(context.Background(), url, app.RedisTLS{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// seed creates amounts with f.rows rows and computes its total by SQL.
func (f *fleet) seed(ctx context.Context) {
	t := f.t
	db, err := pgxpool.New(ctx, f.pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, sql := range []string{
		`CREATE TABLE amounts (id bigint PRIMARY KEY, amount bigint NOT NULL)`,
		fmt.Sprintf(`INSERT INTO amounts SELECT g, (g * 7919) %% 100000 FROM generate_series(1, %d) g`, f.rows),
		`ANALYZE amounts`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatalf("seeding amounts: %v", err)
		}
	}
	if err := db.QueryRow(ctx, "SELECT count(*), sum(amount)::bigint FROM amounts").Scan(&f.want.Rows, &f.want.Sum); err != nil {
		t.Fatal(err)
	}
}

// workerProc is a worker process and what it logged.
type workerProc struct {
	cmd    *exec.Cmd
	out    *testenv.LogBuffer
	exited chan struct{}
}

// startWorker starts one more worker. It is killed when the test ends.
func (f *fleet) startWorker() {
	f.t.Helper()
	w := &workerProc{cmd: exec.Command(f.bin, f.args...), out: &testenv.LogBuffer{}, exited: make(chan struct{})}
	w.cmd.Env = f.env
	w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { _ = w.cmd.Wait(); close(w.exited) }()
	f.t.Cleanup(func() {
		// A stopped worker must continue to die.
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.exited
	})
	f.workers = append(f.workers, w)
}

// dumpLogsOnFailure shows the end of every worker's log when the test
// failed.
func (f *fleet) dumpLogsOnFailure() {
	if !f.t.Failed() {
		return
	}
	if tl := f.timeline.Tail(200); tl != "" {
		f.t.Logf("the run's progress after the fault (seconds after it ended; lines where nothing changed left out):\n%s", tl)
	}
	for i, w := range f.workers {
		f.t.Logf("worker %d (pid %d), the end of its log:\n%s", i, w.cmd.Process.Pid, w.out.Tail(40))
	}
}

// start starts run a and returns its ID.
func (f *fleet) start(a aRun) string {
	f.t.Helper()
	b, _ := json.Marshal(a)
	id, err := f.mr.StartJSON(context.Background(), a.job(), b, mapreduce.StartOptions{})
	if err != nil {
		f.t.Fatalf("starting a run: %v", err)
	}
	return id
}

// waitDone waits until the run has recorded done pages, so that a fault
// lands mid-run; it fails the test if the run ends first or takes more
// than a minute.
func (f *fleet) waitDone(id string, done int) {
	f.t.Helper()
	var st *mapreduce.Status
	if !testenv.Eventually(time.Minute, func() bool {
		var err error
		if st, err = f.mr.Status(context.Background(), id); err != nil {
			f.t.Fatal(err)
		}
		if st.State.Ended() {
			f.t.Fatalf("run %s ended (%s, %s) before %d pages were done: the fault would not land mid-run", id, st.State, st.Error, done)
		}
		return st.Done >= done
	}) {
		f.t.Fatalf("run %s did only %d of %d pages in a minute before the fault: %+v", id, st.Done, done, st)
	}
}

// finish waits for the run to end, at the latest at deadline, and checks
// that it succeeded with the exact total. It returns the run's status, or
// nil (having failed the test, saying which requirement broke) if the run
// did not end by deadline.
func (f *fleet) finish(id string, a aRun, deadline time.Time, req string) *mapreduce.Status {
	f.t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	st, err := f.mr.Wait(ctx, id)
	if err != nil {
		f.t.Errorf("%s: run %s did not end by %s: %v; last status: %s", req, id, deadline.Format("15:04:05.000"), err, describe(st))
		return nil
	}
	f.checkExact(st, a)
	return st
}

// checkExact fails the test unless the run succeeded with a's exact
// result (for sums, the table's total over all its pages).
func (f *fleet) checkExact(st *mapreduce.Status, a aRun) {
	f.t.Helper()
	if st.State != mapreduce.StateSucceeded {
		f.t.Errorf("a run survives the fault and ends exact: run %s ended %s", st.ID, describe(st))
		return
	}
	var got result
	if err := json.Unmarshal(st.Result, &got); err != nil {
		f.t.Errorf("run %s: result %q: %v", st.ID, st.Result, err)
		return
	}
	if want := a.want(f); got != want {
		f.t.Errorf("a run survives the fault and ends exact: run %s (%v): result %+v, want %+v", st.ID, a, got, want)
	}
}

func describe(st *mapreduce.Status) string {
	if st == nil {
		return "none"
	}
	return fmt.Sprintf("%s, %d/%d pages done, %d failed, error %q", st.State, st.Done, st.Total, st.Failed, st.Error)
}

// runTime is how long a run took, by Redis's clock.
func runTime(st *mapreduce.Status) time.Duration { return st.Finished.Sub(st.Created) }

// checkPermits fails the test if Postgres ever ran more worker queries at
// once than the permits, or none (the sampler saw nothing).
func (f *fleet) checkPermits() {
	f.t.Helper()
	most, at := f.sampler.maximum()
	f.t.Logf("Postgres ran at most %d worker queries at once (permits %d)", most, permits)
	if d := f.sampler.spreadDetail(); d != "" {
		f.t.Log(d)
	}
	switch {
	case most > permits:
		f.t.Errorf("%s: Postgres ran %d worker queries at once at %s, with %d permits; %s", reqPermits, most, at.Format("15:04:05.000"), permits, f.sampler.overDetail())
	case most == 0:
		f.t.Errorf("the sampler saw no worker query in pg_stat_activity (application_name %s)", f.app)
	}
}

// semaphoreNow describes the "db" semaphore's holders and waiters now.
func (f *fleet) semaphoreNow() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := f.sem.Stats(ctx)
	if err != nil {
		return fmt.Sprintf("the semaphore's stats: %v", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the semaphore: limit %d, held %d, %d waiting; holders:", st.Limit, st.Held, len(st.Waiters))
	for _, h := range st.Holders {
		fmt.Fprintf(&b, " [%s fence %d held %v lease left %v]", h.Process, h.Fence, h.HeldFor.Round(time.Millisecond), h.LeaseLeft.Round(time.Millisecond))
	}
	return b.String()
}

// checkPermitsFree fails the test unless, by permitsFree after from, the
// "db" semaphore has no holder and no waiter.
func (f *fleet) checkPermitsFree(from time.Time) {
	f.t.Helper()
	var st semaphore.Stats
	var err error
	if testenv.Eventually(time.Until(from.Add(permitsFree)), func() bool {
		st, err = f.sem.Stats(context.Background())
		return err == nil && st.Held == 0 && len(st.Waiters) == 0
	}) {
		return
	}
	if err != nil {
		f.t.Errorf("%s: reading the semaphore: %v", reqPermitsFree, err)
		return
	}
	f.t.Errorf("%s: %v after it ended, %d permits are held (holders %+v) and %d waiting", reqPermitsFree,
		time.Since(from).Round(time.Millisecond), st.Held, st.Holders, len(st.Waiters))
}

// baselines are the undisturbed run times measured in this test process,
// by run arguments: what each fault's cost is measured against.
var baselines sync.Map // aRun → time.Duration

// baseline returns how long an undisturbed run of a takes on this
// machine, measuring it on f the first time this process asks.
func (f *fleet) baseline(a aRun) time.Duration {
	f.t.Helper()
	if d, ok := baselines.Load(a); ok {
		return d.(time.Duration)
	}
	id := f.start(a)
	st := f.finish(id, a, time.Now().Add(2*time.Minute), "an undisturbed run ends within 2 minutes")
	if st == nil || st.State != mapreduce.StateSucceeded {
		f.t.FailNow()
	}
	d := runTime(st)
	f.t.Logf("baseline: %v, undisturbed, took %v", a, d.Round(time.Millisecond))
	baselines.Store(a, d)
	return d
}

// checkResumed fails the test unless a worker query started within bound
// after the fault ended, and returns how long after it the first one did.
func (f *fleet) checkResumed(ended time.Time, bound time.Duration, req string) time.Duration {
	f.t.Helper()
	first, ok := f.sampler.firstStartAfter(ended)
	if !ok {
		f.t.Errorf("%s: no worker query started in the %v after the fault ended", req, time.Since(ended).Round(time.Millisecond))
		return 0
	}
	d := first.Sub(ended)
	f.t.Logf("the first worker query after the fault started %v after it ended (bound %v)", d.Round(time.Millisecond), bound)
	if d > bound {
		f.t.Errorf("%s: the first worker query after the fault started %v after it ended", req, d.Round(time.Millisecond))
	}
	return d
}

// checkCost fails the test unless the run took at most the baseline plus
// the outage plus allowed.
func (f *fleet) checkCost(st *mapreduce.Status, base, outage, allowed time.Duration, req string) {
	f.t.Helper()
	took := runTime(st)
	cost := took - base
	f.t.Logf("the run took %v: the baseline %v, plus %v for an outage of %v (bound: the outage + %v)",
		took.Round(time.Millisecond), base.Round(time.Millisecond), cost.Round(time.Millisecond), outage.Round(time.Millisecond), allowed)
	if cost > outage+allowed {
		f.t.Errorf("%s: the run took %v, %v more than the baseline's %v, for an outage of %v",
			req, took.Round(time.Millisecond), cost.Round(time.Millisecond), base.Round(time.Millisecond), outage.Round(time.Millisecond))
	}
}

// through runs the default run and, once a quarter of its pages are
// done, takes a server away from the workers with fault, which returns once
// the server is back. The run must succeed exact, work resume and the run
// cost no more than sf allows, Postgres never see more worker queries than
// permits, and no permit be held once the run has ended.
func (f *fleet) through(sf serverFault, fault func()) {
	f.t.Helper()
	f.throughRun(defaultRun(), sf, fault)
}

// throughRun is through with the run a.
func (f *fleet) throughRun(a runArgs, sf serverFault, fault func()) {
	f.t.Helper()
	base := f.baseline(a)
	id := f.start(a)
	f.waitDone(id, a.pages(f)/4)
	began := time.Now()
	fault()
	back := time.Now()
	f.follow(id)
	f.sampler.watchClosely(5 * time.Second) // permits change hands in a burst
	f.t.Logf("%s was away from the workers for %v", sf.server, back.Sub(began).Round(time.Millisecond))
	// Past the cost's bound, with time to say by how much.
	st := f.finish(id, a, back.Add(base+sf.cost+5*time.Second), sf.costReq)
	f.checkResumed(back, sf.resume, sf.resumeReq)
	if st != nil && st.State.Ended() {
		f.checkCost(st, base, back.Sub(began), sf.cost, sf.costReq)
		f.checkPermitsFree(st.Finished)
	}
	f.checkPermits()
}

// soak runs a scenario once, or BATCHMR_CHAOS_REPEAT times as subtests
// (make chaos).
func soak(t *testing.T, scenario func(t *testing.T)) {
	n := envInt(t, "BATCHMR_CHAOS_REPEAT", 1)
	if n == 1 {
		scenario(t)
		return
	}
	for i := range n {
		t.Run(fmt.Sprintf("round%d", i+1), scenario)
	}
}

// follow records in f.timeline, every 250 ms until run id ends, the run's
// progress and its queue's counts in asynq: where a stall after a fault
// sits (a page in retry, a task active that nobody works on) shows in it.
func (f *fleet) follow(id string) {
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	start := time.Now()
	go func() {
		every := time.NewTicker(250 * time.Millisecond)
		defer every.Stop()
		last := ""
		for ; ; <-every.C {
			st, err := f.mr.Status(context.Background(), id)
			if err != nil {
				return
			}
			line := fmt.Sprintf("done=%d failed=%d state=%s", st.Done, st.Failed, st.State)
			// The run's job's queue: sums's, or another job's.
			if qi, err := insp.GetQueueInfo(prefix + ":" + st.Job); err == nil {
				line += fmt.Sprintf(" asynq: active=%d pending=%d retry=%d scheduled=%d", qi.Active, qi.Pending, qi.Retry, qi.Scheduled)
			}
			if line != last {
				fmt.Fprintf(&f.timeline, "+%6.2fs %s\n", time.Since(start).Seconds(), line)
				last = line
			}
			if st.State.Ended() {
				return
			}
		}
	}()
}
