package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

// Faults that pass by themselves are told from errors no retry can fix,
// on errors real servers and real clients produce.
func TestIsTransientTellsFaultsThatPassFromErrorsThatLast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.Postgres(t)

	_, refused := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/x?connect_timeout=2")
	_, syntax := pool.Exec(ctx, "SELEC 1")
	_, missing := pool.Exec(ctx, "SELECT * FROM no_such_table_here")
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	redisDown := rdb.Ping(ctx).Err()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, ctxErr := pool.Exec(cancelled, "SELECT 1")

	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"Postgres refusing connections", refused, true},
		{"Postgres shutting down (57P01)", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{"Postgres starting up (57P03)", &pgconn.PgError{Code: "57P03"}, true},
		{"too many connections (53300)", &pgconn.PgError{Code: "53300"}, true},
		{"serialization failure (40001)", fmt.Errorf("page 3: %w", &pgconn.PgError{Code: "40001"}), true},
		{"Redis refusing connections", redisDown, true},
		{"marked by the job", mapreduce.Transient(errors.New("rate limited")), true},
		{"a permit lost mid-query", errors.Join(ctxErr, semaphore.ErrLeaseLost), true},
		{"a SQL syntax error", syntax, false},
		{"a missing table", missing, false},
		{"a cancelled context", ctxErr, false},
		{"an error of the job's own", errors.New("bad row"), false},
		{"a job's error that mentions a refused connection", errors.New("upstream said: connection refused"), false},
		{"nil", nil, false},
	} {
		if c.err == nil && c.want {
			t.Fatalf("%s: the server produced no error", c.name)
		}
		if got := mapreduce.IsTransient(c.err); got != c.want {
			t.Errorf("IsTransient(%s: %v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// flaky counts Map calls per page and fails each page's first calls.
type flaky struct {
	mu    sync.Mutex
	calls map[int]int
}

func (f *flaky) call(lo int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[lo]++
	return f.calls[lo]
}

// outage is the error a page's query gets while Postgres restarts.
var outage = &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}

// flakyJob sums spans; each page's first failFirst calls fail with err.
func flakyJob(name string, f *flaky, failFirst int, err error, o mapreduce.JobOptions) mapreduce.Job[sumArgs, span, int, int] {
	j := sumJob(name, newCounts(), o)
	j.Map = func(ctx context.Context, p span) (int, error) {
		if f.call(p.Lo) <= failFirst {
			return 0, err
		}
		return sumSpan(p), nil
	}
	return j
}

// A database outage makes every page fail for a while. With no retries of
// its own, the job still ends exact: transient errors are retried with
// their own backoff and spend none of the job's retries.
func TestTransientPageErrorsAreRetriedWithoutSpendingTheJobsRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := &flaky{calls: map[int]int{}}
	e.addJob(e.jobs.Add(flakyJob("outage", f, 3, outage, e.opts(mapreduce.JobOptions{
		MapRetries:       -1,
		TransientBackoff: func(int) time.Duration { return 20 * time.Millisecond },
	}))))
	c := e.client()
	e.worker(c, 8)
	id := mustStart(t, c, "outage", sumArgs{N: 2000, PageSize: 100}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Failed != 0 {
		t.Fatalf("run %s ended %s with %d failed pages (%s); want succeeded: transient errors must not spend the job's retries", id, st.State, st.Failed, st.Error)
	}
	if got, want := resultOf(t, c, st), 2000*1999/2; got != want {
		t.Errorf("result %d, want %d", got, want)
	}
	for lo, n := range f.calls {
		if n != 4 {
			t.Errorf("page at %d: Map called %d times, want 4 (3 transient failures, then success)", lo, n)
		}
	}
}

// Transient errors that outlast TransientRetries count as failures: the
// page then fails for good like any other.
func TestTransientErrorsBeyondTransientRetriesFailThePage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := &flaky{calls: map[int]int{}}
	e.addJob(e.jobs.Add(flakyJob("endless", f, 1000, mapreduce.Transient(errors.New("service restarting")), e.opts(mapreduce.JobOptions{
		MapRetries:       -1,
		TransientRetries: 2,
		TransientBackoff: func(int) time.Duration { return 10 * time.Millisecond },
	}))))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "endless", sumArgs{N: 30, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateFailed || st.Failed != 3 {
		t.Fatalf("run ended %s with %d failed pages; want failed with 3", st.State, st.Failed)
	}
	if !strings.Contains(st.Error, "service restarting") {
		t.Errorf("the run's error %q does not name the pages' error", st.Error)
	}
	for lo, n := range f.calls {
		if n != 3 {
			t.Errorf("page at %d: Map called %d times, want 3 (the first try and 2 transient retries)", lo, n)
		}
	}
}

// A Split, Map or Reduce that returns an error wrapping ErrHandedBack
// (this worker cannot do the step, another may) is offered again,
// spending no retry of either kind: with none, the run still succeeds,
// each step having been handed back once.
func TestAStepHandedBackByItsCodeSpendsNoRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	calls := map[string]int{}
	first := func(step string) bool {
		mu.Lock()
		defer mu.Unlock()
		calls[step]++
		return calls[step] == 1
	}
	elsewhere := fmt.Errorf("no database here: %w", mapreduce.ErrHandedBack)
	j := sumJob("elsewhere", newCounts(), e.opts(mapreduce.JobOptions{MapRetries: -1, StepRetries: -1, TransientRetries: -1}))
	split, mapf, reduce := j.Split, j.Map, j.Reduce
	j.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		if first("split") {
			return elsewhere
		}
		return split(ctx, a, emit)
	}
	j.Map = func(ctx context.Context, p span) (int, error) {
		if first(fmt.Sprint("page ", p.Lo)) {
			return 0, elsewhere
		}
		return mapf(ctx, p)
	}
	j.Reduce = func(ctx context.Context, a sumArgs, pages iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
		if first("reduce") {
			return 0, elsewhere
		}
		return reduce(ctx, a, pages)
	}
	e.addJob(e.jobs.Add(j))
	c, logs := e.loggedClient(slog.LevelDebug)
	e.worker(c, 4)
	id := mustStart(t, c, "elsewhere", sumArgs{N: 30, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 60*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Failed != 0 {
		t.Fatalf("run ended %s with %d failed pages (%s); want succeeded: a step handed back spent a retry", st.State, st.Failed, st.Error)
	}
	if got, want := resultOf(t, c, st), 30*29/2; got != want {
		t.Errorf("result %d, want %d", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["split"] != 2 || calls["reduce"] != 2 || calls["page 0"] != 2 || calls["page 20"] != 2 {
		t.Errorf("calls %v; want each step twice: handed back, then run", calls)
	}
	// Five hand-backs within a minute: one warning, the others at debug.
	levels := map[string]int{}
	for _, r := range logs.Records(t) {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "handed back: this worker cannot do it") {
			levels[r["level"].(string)]++
			if e, _ := r["error"].(string); !strings.Contains(e, "no database here") {
				t.Errorf("hand-back logged with error %q; want the step's own", e)
			}
		}
	}
	if levels["WARN"] != 1 || levels["DEBUG"] != 4 {
		t.Errorf("hand-backs logged at %v; want 1 warning and 4 at debug", levels)
	}
}
