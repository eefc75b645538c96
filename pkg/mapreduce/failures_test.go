package mapreduce_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

func TestFailuresListsAFailedRunsPagesByIndexWithTheirErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, failingJob("listed", newCounts(), map[int]bool{10: true, 30: true},
		e.opts(mapreduce.JobOptions{MapRetries: -1}))))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "listed", sumArgs{N: 50, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateFailed {
		t.Fatalf("the run %s, want failed", st.State)
	}
	ctx := context.Background()
	all, total, err := c.Failures(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if total != 2 || len(all) != 2 || all[0].Index != 1 || all[1].Index != 3 {
		t.Fatalf("Failures: %+v (total %d), want pages 1 and 3", all, total)
	}
	if !strings.Contains(all[0].Error, "page at 10 is cursed") || !strings.Contains(string(all[0].Page), "10") {
		t.Errorf("page 1's failure %+v: want its descriptor and its error", all[0])
	}
	// The mark that tells asynq not to retry is asynq's business, not the
	// reader's: Reduce and Failures show Map's error as it returned it.
	if strings.Contains(all[0].Error, "skip retry") {
		t.Errorf("page 1's failure reads %q: want Map's error without asynq's marker", all[0].Error)
	}
	first, total, err := c.Failures(ctx, id, 1)
	if err != nil || len(first) != 1 || first[0].Index != 1 || total != 2 {
		t.Errorf("Failures with max 1: %+v (total %d, %v), want page 1 of 2", first, total, err)
	}
	if _, _, err := c.Failures(ctx, "listed:nosuch", 0); !errors.Is(err, mapreduce.ErrRunNotFound) {
		t.Errorf("Failures of an unknown run: %v, want ErrRunNotFound", err)
	}
}

// A step that fails and retries shows its error in the run's status while
// the run goes on (a split that retries shows nothing else), with its step
// and time; a page's, likewise; Retry starts the run over without it.
func TestAStepsFailedAttemptShowsInTheRunsStatusWhileItRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var splitOK atomic.Bool
	job := sumJob("flaky", newCounts(), e.opts(mapreduce.JobOptions{StepRetries: 5, MapRetries: 5,
		Backoff: func(int, error) time.Duration { return 300 * time.Millisecond }}))
	job.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		if !splitOK.Load() {
			return errors.New(`relation "events" does not exist`)
		}
		return splitSpans(ctx, a, emit)
	}
	var pageFailed atomic.Bool
	sum := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == 10 && pageFailed.CompareAndSwap(false, true) {
			return 0, errors.New("page at 10 is cursed once")
		}
		return sum(ctx, p)
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 2)
	ctx := context.Background()
	began := time.Now()
	id := mustStart(t, c, "flaky", sumArgs{N: 30, PageSize: 10}, mapreduce.StartOptions{})
	var st *mapreduce.Status
	testenv.WaitFor(t, 10*time.Second, "the split's failure in the status", func() bool {
		st, _ = c.Status(ctx, id)
		return st != nil && st.LastError.Step == "split"
	})
	if st.State != mapreduce.StateSplitting || !strings.Contains(st.LastError.Error, `relation "events" does not exist`) ||
		st.LastError.At.Before(began.Add(-time.Minute)) || st.LastError.At.After(time.Now().Add(time.Minute)) {
		t.Errorf("while the split retries: state %s, last error %+v; want splitting, the split's error and when", st.State, st.LastError)
	}

	splitOK.Store(true)
	st = wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.LastError.Step != "page 1" || !strings.Contains(st.LastError.Error, "cursed once") {
		t.Errorf("the run %s with last error %+v; want succeeded, its last error page 1's", st.State, st.LastError)
	}

	// A run that failed, then retried: it starts over without the error.
	var calls atomic.Int32
	release := make(chan struct{})
	job2 := sumJob("doomed", newCounts(), e.opts(mapreduce.JobOptions{StepRetries: -1}))
	job2.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		if calls.Add(1) == 1 {
			return errors.New("no table")
		}
		<-release
		return splitSpans(ctx, a, emit)
	}
	e.addJob(mapreduce.AddJob(e.jobs, job2))
	id2 := mustStart(t, c, "doomed", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	if st := wait(t, c, id2, 30*time.Second); st.State != mapreduce.StateFailed || st.LastError.Step != "split" {
		t.Fatalf("the doomed run %s, last error %+v; want failed, at its split", st.State, st.LastError)
	} else if st.ArgsRefused() {
		t.Errorf("ArgsRefused() of a run whose Split failed (%q) = true, want false: a retry may succeed", st.Error)
	}
	if err := c.Retry(ctx, id2); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the retried split", func() bool { return calls.Load() == 2 })
	if st, err := c.Status(ctx, id2); err != nil || st.State != mapreduce.StateSplitting || st.LastError != (mapreduce.StepError{}) {
		t.Errorf("while the retried split runs: %+v (%v); want splitting, with no last error", st, err)
	}
	close(release)
	if st := wait(t, c, id2, 30*time.Second); st.State != mapreduce.StateSucceeded {
		t.Errorf("the retried run %s, want succeeded", st.State)
	}
}
