package worker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sleepQuery outlasts the test: only a cancel ends it.
const sleepQuery = "SELECT pg_sleep(60)"

// sleepers runs one long query per page under the worker's "db" permits.
var sleepers = mapreduce.Job[int, int, int, int]{
	Name: "sleepers",
	Split: func(ctx context.Context, n int, emit func(int) error) error {
		for i := range n {
			if err := emit(i); err != nil {
				return err
			}
		}
		return nil
	},
	Map: func(ctx context.Context, _ int) (int, error) {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return 0, err
		}
		return 0, pgsource.Exec(ctx, db, sem, sleepQuery)
	},
	Reduce: func(context.Context, int, iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
		return 0, nil
	},
}

// A worker stopped while its handlers' queries run past ShutdownTimeout
// gives their permits back to the rest of the fleet only once those
// queries are gone from the server: asynq abandons the handlers, and the
// worker closes its pool, waiting for their connections, before its
// semaphores. Postgres never runs more of the fleet's queries than permits.
func TestAStoppedWorkersPermitsReachTheFleetOnlyOnceItsQueriesEnded(t *testing.T) {
	t.Parallel()
	const permits = 3
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, sleepers.Name)
	var b [4]byte
	_, _ = rand.Read(b[:])
	app := "worker-stop-test-" + hex.EncodeToString(b[:])

	wctx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	stopped := make(chan error, 1)
	go func() {
		stopped <- worker.Run(wctx, worker.Config{RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t),
			ApplicationName: app, Prefix: prefix, Concurrency: 2 * permits, Permits: map[string]int{worker.DBSemaphore: permits},
			ShutdownTimeout: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler)}, sleepers)
	}()
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sleepers.Start(ctx, mr, 2*permits, mapreduce.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	waitActive(t, app, permits, "the worker's queries")

	// The rest of the fleet: another process's handlers, queued behind the
	// worker's, on a pool whose connections are open already.
	sem, err := semaphore.New(rdb, worker.DBSemaphore, semaphore.Options{Limit: permits, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	pool := warmPool(t, app, permits+1)
	fleet, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	var wg sync.WaitGroup
	for range permits + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = pgsource.Exec(fleet, pool, sem, sleepQuery)
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "the fleet's handlers queued behind the worker's", func() bool {
		st, err := sem.Stats(ctx)
		return err == nil && len(st.Waiters) == 2*permits+1 // the worker's other handlers too
	})

	most, sampleMore := sample(t, app)
	stopWorker()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not stop")
	}
	waitActive(t, app, permits, "the fleet's queries, once the worker stopped")
	sampleMore(5) // a late end of a stopped worker's query would show now
	stopFleet()
	wg.Wait()
	if n := most(); n > permits {
		t.Errorf("Postgres ran %d of the fleet's queries at once with %d permits", n, permits)
	}
	if n := countActive(t, app); n != 0 {
		t.Errorf("Postgres still runs %d queries after every handler returned", n)
	}
	if st, err := sem.Stats(ctx); err != nil || st.Held != 0 {
		t.Errorf("permits held after everything stopped: %+v, %v; want none", st, err)
	}
}

func countActive(t *testing.T, app string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'", app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitActive(t *testing.T, app string, n int, what string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, what, func() bool { return countActive(t, app) == n })
}

// warmPool returns a pool naming its connections app, with n of them open
// and idle.
func warmPool(t *testing.T, app string, n int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		if conns[i], err = pool.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	return pool
}

// sample counts app's active queries every 5ms until the test ends; most
// stops it and gives the most seen at once, more waits until it has
// counted n more times.
func sample(t *testing.T, app string) (most func() int, more func(n int64)) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var max, samples atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			var n int64
			// The queries that ran when the statement began: Postgres reads
			// pg_stat_activity a backend at a time, and a read held up
			// midway would also list a query that took the place of one
			// that ended meanwhile.
			err := conn.QueryRow(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query_start <= statement_timestamp()", app).Scan(&n)
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("sampling pg_stat_activity: %v", err)
				return
			}
			if n > max.Load() {
				max.Store(n)
			}
			samples.Add(1)
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	most = func() int {
		once.Do(func() {
			close(stop)
			<-done
			_ = conn.Close(context.Background())
		})
		return int(max.Load())
	}
	t.Cleanup(func() { most() })
	more = func(n int64) {
		t.Helper()
		want := samples.Load() + n
		testenv.WaitFor(t, 5*time.Second, "the activity sampler", func() bool { return samples.Load() >= want })
	}
	return most, more
}

// A worker that stops while some of its pages wait for their first permit
// hands those back at once: it does not hold the shutdown for
// ShutdownTimeout (or start their queries during it), and the pages, done
// by the next worker, spend no retry (the job allows none) and log no
// failure, although the job's code wraps the semaphore's error as text. A
// page whose first query runs goes on to its end, second query included.
func TestAStoppingWorkerHandsBackPagesStillWaitingForAPermit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	job := mapreduce.Job[int, int, int, int]{
		Name:  "waiters",
		Split: sleepers.Split,
		Map: func(ctx context.Context, p int) (int, error) {
			db, sem, err := worker.Database(ctx)
			if err != nil {
				return 0, err
			}
			for range 2 {
				if err := pgsource.Exec(ctx, db, sem, "SELECT pg_sleep(0.75)"); err != nil {
					return 0, fmt.Errorf("page %d: %v", p, err) // the sentinel lost
				}
			}
			return p, nil
		},
		Options: mapreduce.JobOptions{MapRetries: -1},
	}
	testenv.JobQueue(t, rdb, prefix, job.Name)
	var logs testenv.LogBuffer
	cfg := worker.Config{RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t), Prefix: prefix,
		Concurrency: 4, Permits: map[string]int{worker.DBSemaphore: 1}, ShutdownTimeout: 20 * time.Second,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	wctx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(wctx, cfg, job) }()
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	id, err := job.Start(ctx, mr, 4, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sem, err := semaphore.New(rdb, worker.DBSemaphore, semaphore.Options{Limit: 1, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	testenv.WaitFor(t, 10*time.Second, "one page's query and three waiting", func() bool {
		st, err := sem.Stats(ctx)
		return err == nil && st.Held == 1 && len(st.Waiters) == 3
	})

	began := time.Now()
	stopWorker()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(cfg.ShutdownTimeout):
		t.Fatal("the worker held its shutdown for its whole ShutdownTimeout")
	}
	// The page at work finishes its two queries (1.5 s at most); the
	// waiting ones do not wait, and nothing more starts.
	if took := time.Since(began); took > 6*time.Second {
		t.Errorf("the worker took %v to stop, want about the running page's 1.5 s", took)
	}
	if st, err := mr.Status(ctx, id); err != nil || st.Done != 1 {
		t.Errorf("after the worker stopped: %+v (%v); want the page at work done, with its second query", st, err)
	}
	if st, err := sem.Stats(ctx); err != nil || st.Held != 0 || len(st.Waiters) != 0 {
		t.Errorf("after the worker stopped: %+v (%v); want no permit held or waited for", st, err)
	}

	next, stopNext := context.WithCancel(ctx)
	defer stopNext()
	nextStopped := make(chan error, 1)
	cfg.Logger = slog.New(slog.DiscardHandler)
	go func() { nextStopped <- worker.Run(next, cfg, job) }()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if st, err := mr.Wait(wait, id); err != nil || st.State != mapreduce.StateSucceeded || st.Done != 4 {
		t.Fatalf("the run after the hand-back: %+v, %v; want succeeded with its 4 pages, no retry spent", st, err)
	}
	stopNext()
	<-nextStopped
	var handedBack int
	for _, r := range logs.Records(t) {
		msg, _ := r["msg"].(string)
		if strings.Contains(msg, "handed back: this worker is stopping") {
			handedBack++
		}
		if strings.Contains(msg, "failed") {
			t.Errorf("a failure logged for a page handed back: %v", r)
		}
	}
	if handedBack == 0 {
		t.Error("no page logged as handed back")
	}
}
