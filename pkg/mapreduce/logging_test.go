package mapreduce_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// asynq does not log handler errors, so batchmr does: every failed attempt
// of a page is one log line with its run, job, step, page, attempt, task
// and error,
// and the process that records the run's outcome logs it.
func TestEveryPageFailureIsLoggedWithRunJobPageAttemptAndError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := &flaky{calls: map[int]int{}}
	e.addJob(e.jobs.Add(flakyJob("logged", f, 1000, errors.New("row 7 is malformed"), e.opts(mapreduce.JobOptions{
		MapRetries: 1, Semantics: mapreduce.CompleteSemantics,
	}))))
	c, logs := e.loggedClient(slog.LevelInfo)
	e.worker(c, 2)
	id := mustStart(t, c, "logged", sumArgs{N: 20, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded || st.Failed != 2 {
		t.Fatalf("run ended %s with %d failed pages; want succeeded (complete semantics) with 2", st.State, st.Failed)
	}
	// The outcome is logged once it is recorded, so a moment after wait
	// can see it.
	testenv.WaitFor(t, 5*time.Second, "the run's outcome logged", func() bool {
		return slices.ContainsFunc(logs.Records(t), func(r map[string]any) bool { return r["msg"] == "mapreduce: run ended" })
	})
	attempts := map[float64][]float64{} // page -> attempts logged
	ended := 0
	for _, r := range logs.Records(t) {
		switch r["msg"] {
		case "mapreduce: page failed; retrying", "mapreduce: page failed for good: it is not retried":
			if task, _ := r["task"].(string); r["run"] != id || r["job"] != "logged" || r["step"] != "map" || task == "" || r["error"] == nil {
				t.Errorf("page failure logged without its run, job, step, task or error: %v", r)
			}
			// The error is the page's, without asynq's skip-retry marker.
			if msg, _ := r["error"].(string); !strings.HasSuffix(msg, "row 7 is malformed") {
				t.Errorf("page failure logged with error %q; want the page's own, ending in %q", msg, "row 7 is malformed")
			}
			page, _ := r["page"].(float64)
			attempt, _ := r["attempt"].(float64)
			attempts[page] = append(attempts[page], attempt)
		case "mapreduce: run ended":
			ended++
			if r["run"] != id || r["state"] != "succeeded" {
				t.Errorf("run outcome logged as %v", r)
			}
		}
	}
	for _, page := range []float64{0, 1} {
		if got := attempts[page]; len(got) != 2 || got[0] != 1 || got[1] != 2 {
			t.Errorf("page %v: attempts logged %v, want [1 2] (one line per failed attempt)", page, got)
		}
	}
	if ended != 1 {
		t.Errorf("the run's outcome was logged %d times, want once", ended)
	}
}

// A page's result stays in Redis until its run's retention ends: one of
// over 32 MiB fails its page for good (it would be as large again), saying
// how large and what to do instead; one of over 1 MiB is recorded, with a
// warning (once a minute at most).
func TestALargeResultIsWarnedOfAndAnOversizedOneFailsItsPageNamingTheFix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls [3]atomic.Int32
	job := mapreduce.Job[int, int, string, int]{
		Name: "big",
		Split: func(_ context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(_ context.Context, p int) (string, error) {
			calls[p].Add(1)
			return strings.Repeat("x", []int{33 << 20, 2 << 20, 10}[p]), nil
		},
		Options: e.opts(mapreduce.JobOptions{MapRetries: 3, Semantics: mapreduce.CompleteSemantics}),
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c, logs := e.loggedClient(slog.LevelWarn)
	e.worker(c, 3)
	id := mustStart(t, c, "big", 3, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded || st.Done != 2 || st.Failed != 1 {
		t.Fatalf("the run %s, %d done, %d failed; want succeeded (complete semantics) with the oversized page failed", st.State, st.Done, st.Failed)
	}
	failures, _, err := c.Failures(context.Background(), id, 0)
	if err != nil || len(failures) != 1 || failures[0].Index != 0 || !strings.Contains(failures[0].Error, "33.0 MiB encoded, over the 32 MiB") ||
		!strings.Contains(failures[0].Error, "store of your own") {
		t.Errorf("the failures %+v (%v); want page 0's, naming its size, the limit and the fix", failures, err)
	}
	if n := calls[0].Load(); n != 1 {
		t.Errorf("the oversized page's Map ran %d times, want once: no retry makes it smaller", n)
	}
	var warned int
	for _, r := range logs.Records(t) {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "result is large") {
			warned++
			if r["result_bytes"] != float64(2<<20+2) || r["run"] != id {
				t.Errorf("the warning %v: want the result's size and the page's run", r)
			}
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings of a large result, want 1", warned)
	}
}
