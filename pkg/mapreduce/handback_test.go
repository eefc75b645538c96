package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// failPages makes job's Map fail as fails says for a page's nth call
// (from 1), or run it; it returns the calls made, by page.
func failPages(job *mapreduce.Job[sumArgs, span, int, int], fails func(lo, n int) error) func() map[int]int {
	var mu sync.Mutex
	calls := map[int]int{}
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		mu.Lock()
		calls[p.Lo]++
		n := calls[p.Lo]
		mu.Unlock()
		if err := fails(p.Lo, n); err != nil {
			return 0, err
		}
		return inner(ctx, p)
	}
	return func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[int]int{}
		for k, v := range calls {
			out[k] = v
		}
		return out
	}
}

// runWithPage3Failed runs job over 8 pages in one task, and fails t unless
// the run succeeds (complete semantics) within timeout with one failed
// page, which the callers make page 3.
func runWithPage3Failed(t *testing.T, e *env, job mapreduce.Job[sumArgs, span, int, int], timeout time.Duration) {
	t.Helper()
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	id := packedRun(t, e, c, job.Name, 8, 8)
	e.worker(c, 2)
	if st := wait(t, c, id, timeout); st.State != mapreduce.StateSucceeded || st.Failed != 1 {
		t.Fatalf("run ended %s with %d failed pages (%s); want succeeded with page 3 failed", st.State, st.Failed, st.Error)
	}
}

var errNoDatabase = fmt.Errorf("no database here: %w", mapreduce.ErrHandedBack)

// In a task of several pages, a page that hands itself back is never
// recorded as failed, whatever its neighbours' failures: here one fails
// transiently with no transient retries to spend, so it is final.
func TestAPageHandedBackBesideAFinalFailureRunsAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("hb-final", cnt, e.opts(mapreduce.JobOptions{MapRetries: -1, TransientRetries: -1, Semantics: mapreduce.CompleteSemantics}))
	calls := failPages(&job, func(lo, n int) error {
		switch {
		case lo == 3 && n == 1:
			return mapreduce.Transient(errors.New("the database restarted"))
		case lo == 5 && n == 1:
			return errNoDatabase
		}
		return nil
	})
	runWithPage3Failed(t, e, job, 30*time.Second)
	for _, pr := range cnt.reduced {
		if (pr.Err != nil) != (pr.Index == 3) {
			t.Errorf("page %d: error %v; want only page 3 failed", pr.Index, pr.Err)
		}
	}
	if n := calls()[5]; n != 2 {
		t.Errorf("page 5 mapped %d times, want 2: handed back, then run", n)
	}
}

// A page that fails beside one that keeps handing itself back still
// spends its retries: the task's error counts it.
func TestAPageFailingBesideAHandedBackOneSpendsItsRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("hb-counted", cnt, e.opts(mapreduce.JobOptions{MapRetries: 1, Semantics: mapreduce.CompleteSemantics}))
	calls := failPages(&job, func(lo, n int) error {
		switch {
		case lo == 3:
			return errors.New("page 3 is bad")
		case lo == 5 && n <= 4:
			return errNoDatabase
		}
		return nil
	})
	runWithPage3Failed(t, e, job, 90*time.Second)
	if n := calls()[3]; n != 2 {
		t.Errorf("page 3 (always failing, MapRetries 1) mapped %d times, want 2", n)
	}
}

// An error that hands a step back and says no retry can fix it
// (asynq.SkipRetry) fails the step: SkipRetry wins, for a Reduce as for a
// page.
func TestAHandBackThatAlsoSkipsRetryFailsTheStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := sumJob("hb-skip", newCounts(), e.opts(mapreduce.JobOptions{}))
	var calls atomic.Int32
	j.Reduce = func(context.Context, sumArgs, iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
		calls.Add(1)
		return 0, fmt.Errorf("no database here: %w (and never will be: %w)", mapreduce.ErrHandedBack, asynq.SkipRetry)
	}
	e.addJob(e.jobs.Add(j))
	c := e.client()
	e.worker(c, 2)
	id := mustStart(t, c, "hb-skip", sumArgs{N: 30, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 20*time.Second)
	if st.State != mapreduce.StateFailed || calls.Load() != 1 {
		t.Fatalf("run ended %s after %d Reduce calls (%s); want failed after one", st.State, calls.Load(), st.Error)
	}
}
