package pgsource_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// permits is the limit of every semaphore in these tests.
const permits = 3

// longQuery outlasts every test: only a cancel ends it.
const longQuery = "SELECT pg_sleep(60)"

// appName returns an application_name no other test uses, so that the
// queries a test counts in pg_stat_activity are its own.
func appName(t *testing.T) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "pgsource-test-" + hex.EncodeToString(b[:])
}

// Pools as pgsource meets them: one a user built with pgx's defaults, whose
// cancelled queries pgx abandons with their connection; and a worker's
// (internal/app), as Config.DatabaseURL makes it.
var poolKinds = []struct {
	name string
	open func(t *testing.T, app string) *pgxpool.Pool
}{
	{"own pool", func(t *testing.T, name string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = name
		cfg.MaxConns = 10
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}},
	{"worker pool", func(t *testing.T, name string) *pgxpool.Pool {
		pool, err := app.Postgres(context.Background(), testenv.DatabaseURL(t), name, 10, pgsource.ConfigurePool)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}},
}

// warm opens n connections in pool and leaves them idle, as a worker's
// pool is after a few pages: a permit's next holder starts its query at
// once, without connecting first.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// activity samples, every few milliseconds on a connection of its own, how
// many queries of one application_name Postgres is running, and remembers
// the most it saw.
type activity struct {
	app     string
	conn    *pgx.Conn
	most    atomic.Int64
	samples atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

func watchActivity(t *testing.T, app string) *activity {
	t.Helper()
	return watchActivityOn(t, testenv.DatabaseURL(t), app)
}

// watchActivityOn is watchActivity on the server at url.
func watchActivityOn(t *testing.T, url, app string) *activity {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	a := &activity{app: app, conn: conn, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for {
			n, err := a.count()
			if err != nil {
				t.Errorf("sampling pg_stat_activity: %v", err)
				return
			}
			if int64(n) > a.most.Load() {
				a.most.Store(int64(n))
			}
			a.samples.Add(1)
			select {
			case <-a.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { a.close() })
	return a
}

// count counts the queries that ran when its statement began: Postgres
// reads pg_stat_activity a backend at a time, and a read held up midway
// would also list a query that took the place of one that ended meanwhile.
func (a *activity) count() (int, error) {
	var n int
	err := a.conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query_start <= statement_timestamp()", a.app).Scan(&n)
	return n, err
}

// close stops sampling and returns the most queries seen at once.
func (a *activity) close() int {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.done
	_ = a.conn.Close(context.Background())
	return int(a.most.Load())
}

// waitActive waits until Postgres runs exactly n of a's queries.
func (a *activity) waitActive(t *testing.T, n int, what string) {
	t.Helper()
	got, done := -1, false
	defer func() {
		if !done {
			t.Logf("%s: Postgres ran %d queries when last counted", what, got)
		}
	}()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("%s: Postgres to run %d queries", what, n), func() bool {
		var err error
		if got, err = a.countOnNewConn(t); err != nil {
			t.Fatal(err)
		}
		return got == n
	})
	done = true
}

// sampleMore waits until a's sampler has looked at Postgres n more times:
// a query that runs now, or has not ended yet, shows in a.close's most.
func (a *activity) sampleMore(t *testing.T, n int64) {
	t.Helper()
	want := a.samples.Load() + n
	testenv.WaitFor(t, 5*time.Second, "the activity sampler", func() bool { return a.samples.Load() >= want })
}

// countOnNewConn counts without disturbing the sampler's connection.
func (a *activity) countOnNewConn(t *testing.T) (int, error) {
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'", a.app).Scan(&n)
	return n, err
}

// longQueries runs n long queries through pgsource.Exec under sem, each in
// a goroutine, until ctx is done; the returned wait gives their errors.
func longQueries(ctx context.Context, pool *pgxpool.Pool, sem *semaphore.Semaphore, n int) (wait func() []error) {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pgsource.Exec(ctx, pool, sem, longQuery)
		}()
	}
	return func() []error { wg.Wait(); return errs }
}

// waitQueued waits until sem has n waiters across the fleet.
func waitQueued(t *testing.T, sem *semaphore.Semaphore, n int) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("%d waiters queued", n), func() bool {
		st, err := sem.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(st.Waiters) == n
	})
}

// nothingLeft asserts that no query of a still runs and no permit of sem
// is held: what every test ends with.
func nothingLeft(t *testing.T, a *activity, sem *semaphore.Semaphore) {
	t.Helper()
	if n, err := a.countOnNewConn(t); err != nil || n != 0 {
		t.Errorf("after every call returned Postgres still runs %d queries (%v), want none", n, err)
	}
	st, err := sem.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Held != 0 || len(st.Waiters) != 0 {
		t.Errorf("after every call returned Redis shows %d permits held and %d waiters, want none", st.Held, len(st.Waiters))
	}
}

// The permits' holders are cancelled (their run was) while as many others
// wait for their permits: Postgres never runs more of these queries than
// there are permits, because a permit goes back only once its query is gone
// from the server — whether the pool cancels on the server (a worker's) or
// abandons the connection (pgx's default).
func TestCancelledHoldersQueriesEndBeforeTheirPermitsGoToWaiters(t *testing.T) {
	t.Parallel()
	for _, kind := range poolKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			name := appName(t)
			pool := kind.open(t, name)
			rdb, prefix := testenv.Redis(t)
			sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: permits, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer sem.Close()
			for trial := range 4 {
				warm(t, pool, 2*permits+1)
				a := watchActivity(t, name)
				ctx := context.Background()
				cancelled, cancel := context.WithCancel(ctx)
				holders := longQueries(cancelled, pool, sem, permits)
				a.waitActive(t, permits, "the holders' queries")
				others, stopOthers := context.WithCancel(ctx)
				waiters := longQueries(others, pool, sem, permits+1)
				waitQueued(t, sem, permits+1)

				cancel()
				for _, err := range holders() {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("a cancelled holder's Exec returned %v, want context.Canceled", err)
					}
				}
				a.waitActive(t, permits, "the waiters' queries, once the holders were cancelled")
				a.sampleMore(t, 5) // a late end of a cancelled query would show now
				stopOthers()
				waiters()
				if most := a.close(); most > permits {
					t.Errorf("trial %d: Postgres ran %d of these queries at once with %d permits", trial, most, permits)
				}
				nothingLeft(t, a, sem)
			}
		})
	}
}

// A handler whose run is cancelled while it waits for a permit runs no
// query: its wait ends with the cancel.
func TestAHandlerCancelledWhileWaitingForItsPermitRunsNoQuery(t *testing.T) {
	t.Parallel()
	name := appName(t)
	pool := poolKinds[0].open(t, name)
	rdb, prefix := testenv.Redis(t)
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	a := watchActivity(t, name)
	ctx := context.Background()
	blocker, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pgsource.Exec(waiting, pool, sem, longQuery) }()
	waitQueued(t, sem, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Exec cancelled while waiting: %v, want context.Canceled", err)
	}
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a.sampleMore(t, 5) // a query started now would show
	if most := a.close(); most != 0 {
		t.Errorf("a cancelled waiter ran its query (%d at once)", most)
	}
	nothingLeft(t, a, sem)
}

// cancelAfterReplies cancels a command's context once Redis has answered
// it, if the context carries a cancel under cancelKey.
type cancelAfterReplies struct{}

type cancelKey struct{}

func (cancelAfterReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (cancelAfterReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
			cancel()
		}
		return err
	}
}
func (cancelAfterReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A permit that Redis grants just as the handler's run is cancelled (the
// cancel lands before the handler reads the grant) goes straight back, and
// no query starts.
func TestAPermitGrantedAsTheRunIsCancelledGoesBackWithoutAQuery(t *testing.T) {
	t.Parallel()
	name := appName(t)
	pool := poolKinds[0].open(t, name)
	rdb, prefix := testenv.Redis(t)
	rdb.AddHook(cancelAfterReplies{})
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	a := watchActivity(t, name)
	for range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		ctx = context.WithValue(ctx, cancelKey{}, cancel) // cancelled by the acquire's reply
		if err := pgsource.Exec(ctx, pool, sem, longQuery); !errors.Is(err, context.Canceled) {
			t.Errorf("Exec whose context ended as the permit came: %v, want context.Canceled", err)
		}
	}
	a.sampleMore(t, 5) // a query started now would show
	if most := a.close(); most != 0 {
		t.Errorf("a handler cancelled as its permit came ran its query (%d at once)", most)
	}
	nothingLeft(t, a, sem)
}

// A function given to Do that returns with its rows unread leaves its
// query running on the server; Do ends it before the permit goes back.
func TestDoEndsAQueryWhoseRowsItsFunctionLeftUnread(t *testing.T) {
	t.Parallel()
	for _, kind := range poolKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			name := appName(t)
			pool := kind.open(t, name)
			rdb, prefix := testenv.Redis(t)
			sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer sem.Close()
			a := &activity{app: name}
			err = pgsource.Do(context.Background(), pool, sem, func(ctx context.Context, conn *pgx.Conn) error {
				// Rows enough for the server to send some at once (more
				// than its 8kB buffer, less than the socket takes), then a
				// long wait; the rows are never read nor closed.
				_, err := conn.Query(ctx, `SELECT g::text FROM generate_series(1, 20000) g
					UNION ALL SELECT pg_sleep(60)::text`)
				if err != nil {
					return err
				}
				a.waitActive(t, 1, "the query whose rows are left unread")
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			nothingLeft(t, a, sem)
		})
	}
}

// Postgres ignores a cancel request that reaches a backend while it still
// reads the query, and on a loaded machine a request sent as the query
// goes out can land so. The proxy drops the first cancel request, as such
// a backend would: a worker's pool asks again, and the query ends (and its
// permit goes back) at once, not after the cancelDeadline of seconds at
// which pgx gives up on the connection.
func TestAWorkerPoolAsksAgainWhenACancelIsLost(t *testing.T) {
	t.Parallel()
	p := startPgProxy(t)
	p.dropCancels = 1
	name := appName(t)
	pool, err := app.Postgres(context.Background(), p.url(t), name, 2, pgsource.ConfigurePool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb, prefix := testenv.Redis(t)
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	a := watchActivity(t, name)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- pgsource.Exec(ctx, pool, sem, longQuery) }()
	a.waitActive(t, 1, "the query through the proxy")
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Exec returned %v, want an error wrapping context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the query ran on 2s after its cancel was lost: the pool did not ask again")
	}
	p.mu.Lock()
	cancels := p.cancels
	p.mu.Unlock()
	if cancels < 2 {
		t.Errorf("the proxy saw %d cancel requests, want the lost one and at least one more", cancels)
	}
	nothingLeft(t, a, sem)
	// The connection outlived its cancelled query: the pool did not have
	// to close it to be rid of the query.
	if st := pool.Stat(); st.TotalConns() != 1 {
		t.Errorf("the pool holds %d connections after the cancel, want the query's own still open", st.TotalConns())
	}
}

// A query taken under a second permit inside Do's function would wait for
// a permit that callers like it hold: with one permit, for ever. Do says
// so at once, and its own permit goes back.
func TestDoInsideDoOfTheSameSemaphoreFailsAtOnce(t *testing.T) {
	t.Parallel()
	pool := poolKinds[1].open(t, appName(t))
	rdb, prefix := testenv.Redis(t)
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	other, err := semaphore.New(rdb, "other", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var inner, another error
	err = pgsource.Do(ctx, pool, sem, func(ctx context.Context, conn *pgx.Conn) error {
		_, inner = pgsource.Fetch(ctx, pool, sem, "SELECT 1", pgsource.KeyRange{}, pgx.RowTo[int32])
		// Another semaphore's permit is no nesting.
		another = pgsource.Exec(ctx, pool, other, "SELECT 1")
		return inner
	})
	var nested *pgsource.NestedError
	if !errors.As(inner, &nested) || nested.Semaphore != "db" || !errors.As(err, &nested) {
		t.Errorf("Fetch inside Do of the same semaphore: %v (Do: %v); want a NestedError naming db", inner, err)
	}
	if ctx.Err() != nil {
		t.Errorf("the nested call waited until the test's deadline")
	}
	if another != nil {
		t.Errorf("Exec under another semaphore inside Do: %v, want it to run", another)
	}
	if st, err := sem.Stats(context.Background()); err != nil || st.Held != 0 {
		t.Errorf("after Do returned: %d permits held (%v), want none", st.Held, err)
	}
}
