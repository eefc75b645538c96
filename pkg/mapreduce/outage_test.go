package mapreduce_test

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// pgError is an error of Postgres's as pgx gives it: with its SQLSTATE.
type pgError struct{ code, msg string }

func (e *pgError) Error() string    { return e.msg + " (SQLSTATE " + e.code + ")" }
func (e *pgError) SQLState() string { return e.code }

// failingCalls sums its pages, each of whose Map calls fails with fail(n)
// for the nth call of the run's (from 1) while it returns an error.
func failingCalls(name string, fail func(n int64) error, o mapreduce.JobOptions) mapreduce.Job[sumArgs, span, int, int] {
	var calls atomic.Int64
	return mapreduce.Job[sumArgs, span, int, int]{
		Name:  name,
		Split: splitSpans,
		Map: func(ctx context.Context, p span) (int, error) {
			if err := fail(calls.Add(1)); err != nil {
				return 0, err
			}
			return sumSpan(p), nil
		},
		Reduce: func(ctx context.Context, _ sumArgs, pages iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
			total := 0
			for pr, err := range pages {
				if err != nil {
					return 0, err
				}
				total += pr.Result
			}
			return total, nil
		},
		Options: o,
	}
}

// byMessage counts records at warn and above by message, and returns
// the records whose message has prefix.
func byMessage(recs []map[string]any, prefix string) (map[string]int, []map[string]any) {
	warns := map[string]int{}
	var with []map[string]any
	for _, r := range recs {
		msg, _ := r["msg"].(string)
		if r["level"] == "WARN" || r["level"] == "ERROR" {
			warns[msg]++
		}
		if strings.HasPrefix(msg, prefix) {
			with = append(with, r)
		}
	}
	return warns, with
}

// Pages that fail because the database is away (here: SQLSTATE 08006, a
// connection failure, 40 times over 10 pages) retry without spending
// their retries, and the outage is two lines, not one per attempt: a
// warning when it starts, with the first error and the page's
// attributes, and once a page of the job succeeds, an info line with how
// many attempts failed for it.
func TestADatabaseOutageIsLoggedWhenItStartsAndWhenItEndsNotPerAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const outageFailures = 40
	down := &pgError{"08006", "FATAL: terminating connection: server closed the connection unexpectedly"}
	failed := make(chan struct{})
	var once sync.Once
	j := failingCalls("outaged", func(n int64) error {
		if n <= outageFailures {
			once.Do(func() { close(failed) })
			return down
		}
		return nil
	}, e.opts(mapreduce.JobOptions{MapRetries: 0, TransientBackoff: func(int) time.Duration { return 5 * time.Millisecond }}))
	// The split, which reads no database, succeeds during the outage: that
	// must not end it.
	j.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		if err := splitSpans(ctx, a, emit); err != nil {
			return err
		}
		select {
		case <-failed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.addJob(e.jobs.Add(j))
	c, logs := e.loggedClient(slog.LevelInfo)
	e.worker(c, 4)
	id := mustStart(t, c, "outaged", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded || st.Failed != 0 {
		t.Fatalf("the run ended %s with %d failed pages; want succeeded, exact, the outage spending no retry", st.State, st.Failed)
	}
	warns, lines := byMessage(logs.Records(t), "mapreduce: database unreachable")
	if len(lines) != 2 {
		t.Fatalf("want two lines of the outage, its start and its end; got %d: %v", len(lines), lines)
	}
	start, end := lines[0], lines[1]
	if start["level"] != "WARN" || start["run"] != id || start["page"] == nil || !strings.Contains(start["error"].(string), down.msg) {
		t.Errorf("the outage's start: %v; want a warning with the run, the page and the first error", start)
	}
	if end["level"] != "INFO" || end["failures"] != float64(outageFailures) || end["lasted"] == nil {
		t.Errorf("the outage's end: %v; want info with how long it lasted and the %d attempts that failed for it", end, outageFailures)
	}
	delete(warns, start["msg"].(string))
	if len(warns) != 0 {
		t.Errorf("the outage logged other warnings: %v", warns)
	}
}

// A page's own errors are no outage, also those its job marks transient
// (a rate limit of its own): each failed attempt is a warning of its own.
func TestAPagesOwnTransientErrorsAreLoggedEachTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	own := mapreduce.Transient(errors.New("the pricing service says: slow down"))
	e.addJob(e.jobs.Add(failingCalls("limited", func(n int64) error {
		if n <= 6 {
			return own
		}
		return nil
	}, e.opts(mapreduce.JobOptions{TransientBackoff: func(int) time.Duration { return 5 * time.Millisecond }}))))
	c, logs := e.loggedClient(slog.LevelInfo)
	e.worker(c, 2)
	id := mustStart(t, c, "limited", sumArgs{N: 20, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded {
		t.Fatalf("the run ended %s; want succeeded", st.State)
	}
	warns, _ := byMessage(logs.Records(t), "")
	if got := warns["mapreduce: page failed; retrying"]; got != 6 {
		t.Errorf("the page's own transient error logged %d times, want each of its 6 failures: %v", got, warns)
	}
}

// Wait rides out a Redis outage, and says so in two lines, not one per
// poll: a warning when its first poll fails, and an info line with how
// long the outage lasted once a poll succeeds again.
func TestWaitThroughARedisOutageLogsItsStartAndEndNotEachPoll(t *testing.T) {
	t.Parallel()
	s := testenv.PrivateRedisServer(t, "--appendonly", "yes", "--appendfsync", "always")
	prefix := testenv.Prefix(t)
	e := &env{t: t, rdb: s.Client, prefix: prefix, queue: testenv.Queue(t, s.Client, prefix), jobs: mapreduce.NewJobs()}
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c, logs := e.loggedClient(slog.LevelDebug)
	ctx := context.Background()
	id := mustStart(t, c, "sum", sumArgs{N: 40, PageSize: 10}, mapreduce.StartOptions{}) // no worker yet: it waits
	type waited struct {
		st  *mapreduce.Status
		err error
	}
	done := make(chan waited, 1)
	go func() {
		st, err := c.Wait(ctx, id)
		done <- waited{st, err}
	}()
	s.Kill()
	testenv.WaitFor(t, 30*time.Second, "two of Wait's polls to fail", func() bool {
		return strings.Contains(logs.String(), "failed during an outage: Redis unreachable") // a failure after the first
	})
	s.Start()
	e.worker(e.client(), 4)
	select {
	case w := <-done:
		if w.err != nil || w.st.State != mapreduce.StateSucceeded {
			t.Fatalf("Wait: %+v, %v; want the run succeeded", w.st, w.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return within 30 s of Redis's return")
	}
	warns, lines := byMessage(logs.Records(t), "mapreduce: Redis unreachable")
	started := 0
	for _, l := range lines {
		if l["level"] == "WARN" {
			started++
		}
	}
	if started != 1 {
		t.Errorf("Wait logged the outage's start %d times at warn, want once: %v", started, warns)
	}
	var over map[string]any
	for _, l := range lines {
		if l["level"] == "INFO" {
			over = l
		}
	}
	if over == nil {
		t.Fatalf("no info line ended the outage: %v", lines)
	}
	if f, _ := over["failures"].(float64); f < 2 {
		t.Errorf("the outage's end counts %v failed polls, want at least 2: the test proves nothing", over["failures"])
	}
	for msg := range warns {
		if strings.Contains(msg, "wait") {
			t.Errorf("Wait logged %q at warn", msg)
		}
	}
}
