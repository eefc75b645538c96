package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// runKey is one of a run's keys, as docs/mapreduce.md lays them out: kind
// is run, recorded, results or failures.
func (e *env) runKey(id, kind string) string {
	job, _, _ := strings.Cut(id, ":")
	return e.prefix + ":{" + job + "}:" + kind + ":" + id
}

// outageJob sums spans; while down is set, the pages at Lo 10, 40 and 70
// fail, as pages fail while a database is unreachable. Under
// CompleteSemantics its Reduce fails when it sees a failed page.
func outageJob(name string, cnt *counts, down *atomic.Bool, o mapreduce.JobOptions) mapreduce.Job[sumArgs, span, int, int] {
	j := sumJob(name, cnt, o)
	j.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mapped(p.Lo)
		if down.Load() && p.Lo%30 == 10 {
			return 0, fmt.Errorf("page at %d: connection refused", p.Lo)
		}
		return sumSpan(p), nil
	}
	reduce := j.Reduce
	j.Reduce = func(ctx context.Context, a sumArgs, pages iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
		total, err := reduce(ctx, a, pages)
		if err != nil {
			return 0, err
		}
		cnt.mu.Lock()
		defer cnt.mu.Unlock()
		for _, pr := range cnt.reduced {
			if pr.Err != nil {
				return 0, fmt.Errorf("page %d failed: refusing a partial total", pr.Index)
			}
		}
		return total, nil
	}
	return j
}

// A run whose pages failed during an outage ends failed; Retry resumes it:
// only the failed pages run again (a retry during the outage fails them
// again, and ends like any run), and once the outage is over the run
// succeeds with the exact result, Reduce having run once more over every
// page. Pages that succeeded the first time are never processed again.
func TestRetryRerunsOnlyTheFailedPagesOfAFailedRunAndReducesOnceMore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		semantics mapreduce.Semantics
		name      string
		reduces   int // Reduce calls per attempt that fails
	}{
		{mapreduce.SuccessSemantics, "success", 0},
		{mapreduce.CompleteSemantics, "complete", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			cnt := newCounts()
			var down atomic.Bool
			down.Store(true)
			e.addJob(mapreduce.AddJob(e.jobs, outageJob("sum", cnt, &down,
				e.opts(mapreduce.JobOptions{Semantics: tc.semantics, MapRetries: 1, StepRetries: -1}))))
			c := e.client()
			ctx := context.Background()
			id := mustStart(t, c, "sum", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{})
			w := e.worker(c, 4)
			st := wait(t, c, id, 30*time.Second)
			if st.State != mapreduce.StateFailed || st.Done != 7 || st.Failed != 3 {
				t.Fatalf("during the outage: %s, %d done, %d failed (%s); want failed with 3 failed pages", st.State, st.Done, st.Failed, st.Error)
			}
			w.Shutdown() // so that the resumed run waits to be looked at

			if err := c.Retry(ctx, id); err != nil {
				t.Fatal(err)
			}
			st, err := c.Status(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != mapreduce.StateSplitting || st.Retries != 1 || st.Retried.IsZero() || st.Total != -1 ||
				st.Done != 7 || st.Failed != 0 || st.Error != "" || st.Result != nil || !st.Finished.IsZero() || !st.SplitDone.IsZero() {
				t.Fatalf("resumed run: %+v; want splitting, retry 1, 7 pages kept, no failure, error, result or end", st)
			}
			if r, ok := st.Rate(time.Now()); ok {
				t.Errorf("the resumed run has recorded nothing since its Retry, yet its rate reads %.1f pages/s", r)
			}
			for _, kind := range []string{"run", "recorded", "results"} {
				if ttl := e.rdb.PTTL(ctx, e.runKey(id, kind)).Val(); ttl != -1 {
					t.Errorf("the resumed run's %s key expires in %v; want no expiry until it ends", kind, ttl)
				}
			}
			if n := e.rdb.Exists(ctx, e.runKey(id, "failures")).Val(); n != 0 {
				t.Errorf("the resumed run still has its failures")
			}

			// Still down: the same three pages fail again, and the run ends
			// failed again, its keys expiring.
			e.worker(c, 4)
			st = wait(t, c, id, 30*time.Second)
			if st.State != mapreduce.StateFailed || st.Done != 7 || st.Failed != 3 || st.Retries != 1 {
				t.Fatalf("retried during the outage: %s, %d done, %d failed, %d retries; want failed again with 3 failed pages", st.State, st.Done, st.Failed, st.Retries)
			}
			if ttl := e.rdb.PTTL(ctx, e.runKey(id, "run")).Val(); ttl <= 0 {
				t.Errorf("the run failed again, but its record does not expire (TTL %v)", ttl)
			}

			down.Store(false)
			if err := c.Retry(ctx, id); err != nil {
				t.Fatal(err)
			}
			st = wait(t, c, id, 30*time.Second)
			if st.State != mapreduce.StateSucceeded || st.Total != 10 || st.Done != 10 || st.Failed != 0 || st.Retries != 2 {
				t.Fatalf("retried after the outage: %s, %d/%d done, %d failed, %d retries (%s); want succeeded with 10 pages", st.State, st.Done, st.Total, st.Failed, st.Retries, st.Error)
			}
			if got := resultOf(t, c, st); got != 100*99/2 {
				t.Errorf("result %d, want %d", got, 100*99/2)
			}
			// Its rate counts the 3 pages done since the last Retry, over
			// the time since then, whenever it is read.
			if r, ok := st.Rate(time.Now().Add(time.Hour)); !ok || math.Abs(r*st.Finished.Sub(st.Retried).Seconds()-3) > 1e-6 {
				t.Errorf("rate %.2f pages/s (%v) over the %v since the Retry; want 3 pages over that time, not the 7 kept",
					r, ok, st.Finished.Sub(st.Retried))
			}
			if st.RetriedDone != 7 {
				t.Errorf("RetriedDone %d, want the 7 pages the last Retry kept", st.RetriedDone)
			}
			// A run whose note of the pages its last Retry kept is stale (of
			// an earlier Retry) or missing has no rate, rather than a wrong one.
			for _, older := range []func(){
				func() { e.rdb.HIncrBy(ctx, e.runKey(id, "run"), "retries", 1) },
				func() { e.rdb.HDel(ctx, e.runKey(id, "run"), "retried_done") },
			} {
				older()
				if old, err := c.Status(ctx, id); err != nil {
					t.Fatal(err)
				} else if r, ok := old.Rate(time.Now()); ok || old.RetriedDone != -1 {
					t.Errorf("a run whose note of the pages kept is stale or missing: rate %.2f (%v), RetriedDone %d; want no rate and -1", r, ok, old.RetriedDone)
				}
			}
			if ttl := e.rdb.PTTL(ctx, e.runKey(id, "run")).Val(); ttl <= 0 {
				t.Errorf("the run succeeded, but its record does not expire (TTL %v)", ttl)
			}
			cnt.mu.Lock()
			defer cnt.mu.Unlock()
			for lo := 0; lo < 100; lo += 10 {
				want := 1 // succeeded the first time: never again
				if lo%30 == 10 {
					want = 2 + 2 + 1 // Map and its one retry in each failed attempt, then once
				}
				if cnt.maps[lo] != want {
					t.Errorf("page at %d mapped %d times, want %d", lo, cnt.maps[lo], want)
				}
			}
			if want := 2*tc.reduces + 1; cnt.reduces != want || len(cnt.reduced) != 10 {
				t.Errorf("Reduce ran %d times, the last over %d pages; want %d, the last over 10", cnt.reduces, len(cnt.reduced), want)
			}
			for _, pr := range cnt.reduced {
				if pr.Err != nil {
					t.Errorf("the last Reduce saw page %d failed: %v", pr.Index, pr.Err)
				}
			}
		})
	}
}

// A run cancelled while some of its pages were at work is resumed by
// Retry: the pages recorded before the cancel are kept, the others run,
// and the run ends with the exact result.
func TestRetryResumesACancelledRunToTheExactResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	var open atomic.Bool
	var held, returned atomic.Int32
	j := sumJob("sum", cnt, e.opts(mapreduce.JobOptions{}))
	j.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mapped(p.Lo)
		if p.Lo >= 40 && !open.Load() {
			held.Add(1)
			defer returned.Add(1)
			<-ctx.Done() // held until the cancel
			return 0, ctx.Err()
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c := e.client()
	ctx := context.Background()
	e.worker(c, 12) // every page at once
	id := mustStart(t, c, "sum", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{})
	testenv.WaitFor(t, 10*time.Second, "four pages recorded and six held", func() bool {
		st, err := c.Status(ctx, id)
		return err == nil && st.Done == 4 && held.Load() == 6
	})
	if err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the held pages to see the cancel", func() bool { return returned.Load() == 6 })

	open.Store(true)
	if err := c.Retry(ctx, id); err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 10 || st.Failed != 0 || st.Retries != 1 || resultOf(t, c, st) != 100*99/2 {
		t.Fatalf("resumed run: %s, %d done, %d failed, %d retries (%s); want succeeded with %d", st.State, st.Done, st.Failed, st.Retries, st.Error, 100*99/2)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	for lo := 0; lo < 100; lo += 10 {
		want := 1
		if lo >= 40 {
			want = 2 // held and cancelled, then run
		}
		if cnt.maps[lo] != want {
			t.Errorf("page at %d mapped %d times, want %d", lo, cnt.maps[lo], want)
		}
	}
	if cnt.reduces != 1 {
		t.Errorf("Reduce ran %d times, want once", cnt.reduces)
	}
}

// A run cancelled while its Reduce was running — a Reduce that does not
// heed its context — is resumed: every page is recorded, so the split
// enqueues nothing and the run goes straight to reducing. The first
// attempt's Reduce, returning late, cannot end the resumed run: only the
// new Reduce's result is recorded.
func TestAReduceOfTheCancelledAttemptCannotEndTheResumedRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	var reduces atomic.Int32
	releaseFirst, releaseSecond := make(chan struct{}), make(chan struct{})
	openFirst := sync.OnceFunc(func() { close(releaseFirst) })
	j := sumJob("sum", cnt, e.opts(mapreduce.JobOptions{}))
	reduce := j.Reduce
	j.Reduce = func(ctx context.Context, a sumArgs, pages iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
		if reduces.Add(1) == 1 {
			<-releaseFirst // deaf to the cancel
			return -1, nil
		}
		<-releaseSecond
		return reduce(ctx, a, pages)
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c := e.client()
	ctx := context.Background()
	e.worker(c, 4)
	t.Cleanup(func() { openFirst(); close(releaseSecond) }) // before the worker stops: no Reduce keeps it
	id := mustStart(t, c, "sum", sumArgs{N: 40, PageSize: 10}, mapreduce.StartOptions{})
	testenv.WaitFor(t, 10*time.Second, "the first Reduce", func() bool { return reduces.Load() == 1 })
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	var firstReduce string
	// The last page's task may still be listed active a moment longer.
	testenv.WaitFor(t, 10*time.Second, "the reduce task among the active ones", func() bool {
		active, _ := insp.ListActiveTasks(e.queue)
		for _, ti := range active {
			if ti.Type == mapreduce.TypeReduce {
				firstReduce = ti.ID
			}
		}
		return firstReduce != ""
	})
	if err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}

	if err := c.Retry(ctx, id); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the resumed run's Reduce", func() bool { return reduces.Load() == 2 })
	openFirst()
	testenv.WaitFor(t, 10*time.Second, "the first Reduce's task to complete", func() bool {
		ti, err := insp.GetTaskInfo(e.queue, firstReduce)
		return err == nil && ti.State == asynq.TaskStateCompleted
	})
	if st, _ := c.Status(ctx, id); st.State != mapreduce.StateReducing {
		t.Fatalf("after the first attempt's Reduce returned: %s with result %s; want still reducing", st.State, st.Result)
	}
	releaseSecond <- struct{}{}
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 40*39/2 {
		t.Fatalf("resumed run: %s with %s (%s); want succeeded with %d", st.State, st.Result, st.Error, 40*39/2)
	}
	if n, _ := cnt.snapshot(); n != 4 {
		t.Errorf("Map ran %d times, want once per page: every page was recorded before the cancel", n)
	}
}

// While a retried run goes on, its pages are delivered again and again:
// the earlier attempt's archived map tasks are re-run from asynq's archive
// and copied, and the new attempt's map tasks are copied twice. Every page
// is still recorded once, the earlier attempt's tasks record nothing, and
// the result is exact.
func TestRetryRecordsEachPageOnceWhateverIsDeliveredAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	var down atomic.Bool
	down.Store(true)
	e.addJob(mapreduce.AddJob(e.jobs, outageJob("sum", cnt, &down, e.opts(mapreduce.JobOptions{MapRetries: -1}))))
	c := e.client()
	ctx := context.Background()
	id := mustStart(t, c, "sum", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{})
	w := e.worker(c, 4)
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateFailed || st.Failed != 3 {
		t.Fatalf("during the outage: %s, %d failed; want failed with 3 failed pages", st.State, st.Failed)
	}
	w.Shutdown()
	down.Store(false)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	archived, err := insp.ListArchivedTasks(e.queue)
	if err != nil || len(archived) != 3 {
		t.Fatalf("%d archived tasks (%v), want the 3 failed pages'", len(archived), err)
	}

	if err := c.Retry(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	resumed := e.pendingTasks(mapreduce.TypeMap)
	if len(resumed) != 3 {
		t.Fatalf("the resumed split enqueued %d pages, want the 3 that failed", len(resumed))
	}
	// The earlier attempt's tasks, delivered by hand: they do not reach Map.
	calls, _ := cnt.snapshot()
	for _, ti := range archived {
		if err := c.ProcessTask(ctx, task(ti)); err != nil {
			t.Fatalf("a task of the earlier attempt: %v", err)
		}
	}
	if after, _ := cnt.snapshot(); after != calls {
		t.Errorf("the earlier attempt's tasks called Map %d times, want none", after-calls)
	}
	aq := asynq.NewClientFromRedisClient(e.rdb)
	t.Cleanup(func() { _ = aq.Close() })
	again := func(ti *asynq.TaskInfo) {
		if _, err := aq.Enqueue(task(ti), asynq.Queue(e.queue)); err != nil {
			t.Fatal(err)
		}
	}
	for _, ti := range archived {
		again(ti)
	}
	for _, ti := range resumed {
		again(ti)
		again(ti)
	}
	if n, err := insp.RunAllArchivedTasks(e.queue); err != nil || n != 3 {
		t.Fatalf("re-ran %d archived tasks (%v), want 3", n, err)
	}
	// One page is also delivered twice at once, by hand.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if err := c.ProcessTask(ctx, task(resumed[0])); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	e.worker(c, 8)
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 10 || st.Failed != 0 || resultOf(t, c, st) != 100*99/2 {
		t.Fatalf("resumed run: %s, %d done, %d failed (%s); want succeeded with 10 pages and %d", st.State, st.Done, st.Failed, st.Error, 100*99/2)
	}
	testenv.WaitFor(t, 10*time.Second, "every copy to be processed", func() bool {
		q, err := insp.GetQueueInfo(e.queue)
		return err == nil && q.Pending == 0 && q.Active == 0 && q.Retry == 0
	})
	if q, _ := insp.GetQueueInfo(e.queue); q.Archived != 0 {
		t.Errorf("%d tasks archived after the retry, want none: a copy of a page failed", q.Archived)
	}
	if n := e.rdb.BitCount(ctx, e.runKey(id, "recorded"), nil).Val(); n != 10 {
		t.Errorf("%d pages recorded, want 10", n)
	}
	if n, err := c.StoredResults(ctx, id); err != nil || n != 10 {
		t.Errorf("%d results stored (%v), want 10", n, err)
	}
	if st, _ := c.Status(ctx, id); st.Done != 10 || st.State != mapreduce.StateSucceeded {
		t.Errorf("after every copy ran: %s with %d done; want succeeded with 10", st.State, st.Done)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	for lo := 0; lo < 100; lo += 10 {
		n := cnt.maps[lo]
		switch {
		case lo%30 != 10 && n != 1:
			t.Errorf("page at %d, which succeeded the first time, mapped %d times", lo, n)
		case lo%30 == 10 && (n < 2 || n > 4):
			// Once in the outage, then once per delivery of the resumed
			// attempt that found the page unrecorded: its task or a copy
			// (three), or the two deliveries by hand.
			t.Errorf("page at %d mapped %d times, want 2 to 4", lo, n)
		}
	}
	if cnt.reduces != 1 {
		t.Errorf("Reduce ran %d times, want once", cnt.reduces)
	}
}

// Retry says why it cannot resume a run, and changes nothing: a run that
// succeeded, one still going, one whose job forbids overlap while another
// run is active, one of a job nobody knows, and one that does not exist.
func TestRetryRefusesRunsItCannotResumeSayingWhy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var open atomic.Bool
	held := sumJob("held", newCounts(), e.opts(mapreduce.JobOptions{}))
	held.Map = func(ctx context.Context, p span) (int, error) {
		for !open.Load() {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, held))
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	ctx := context.Background()
	e.worker(c, 4)

	done := mustStart(t, c, "sum", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	wait(t, c, done, 30*time.Second)
	if err := c.Retry(ctx, done); !errors.Is(err, mapreduce.ErrRunSucceeded) || !strings.Contains(err.Error(), "start a new run") {
		t.Errorf("Retry of a succeeded run: %v; want ErrRunSucceeded, saying to start a new run", err)
	}

	first := mustStart(t, c, "held", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	if err := c.Retry(ctx, first); !errors.Is(err, mapreduce.ErrRunNotEnded) || !strings.Contains(err.Error(), "cancel it") {
		t.Errorf("Retry of a running run: %v; want ErrRunNotEnded, saying to wait or cancel it", err)
	}
	if err := c.Cancel(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := mustStart(t, c, "held", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	if err := c.Retry(ctx, first); !errors.Is(err, mapreduce.ErrRunActive) || !strings.Contains(err.Error(), second) {
		t.Errorf("Retry while another run of the job is active: %v; want ErrRunActive naming %s", err, second)
	}
	if st, _ := c.Status(ctx, first); st.State != mapreduce.StateCancelled || st.Retries != 0 {
		t.Errorf("a refused Retry changed the run: %s, %d retries", st.State, st.Retries)
	}

	// A process that neither runs the job nor finds it in the catalogue.
	stranger, err := mapreduce.New(e.rdb, mapreduce.Config{Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, second); err != nil {
		t.Fatal(err)
	}
	if err := stranger.Retry(ctx, first); !errors.Is(err, mapreduce.ErrUnknownJob) {
		t.Errorf("Retry of a run whose job nobody announced: %v; want ErrUnknownJob", err)
	}
	if err := c.Retry(ctx, "held:nope"); !errors.Is(err, mapreduce.ErrRunNotFound) {
		t.Errorf("Retry of an unknown run: %v; want ErrRunNotFound", err)
	}
	if err := c.Retry(ctx, "not a run id"); err == nil || !strings.Contains(err.Error(), "<job>:<key>") {
		t.Errorf("Retry of a malformed ID: %v", err)
	}

	// Once the other run has ended, the first is resumed, and takes the
	// job's turn: a new start is refused while it runs.
	if err := c.Retry(ctx, first); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartAny(ctx, "held", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrRunActive) || !strings.Contains(err.Error(), first) {
		t.Errorf("Start while the resumed run is active: %v; want ErrRunActive naming %s", err, first)
	}
	open.Store(true)
	if st := wait(t, c, first, 30*time.Second); st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 45 {
		t.Errorf("the resumed run: %s (%s), want succeeded with 45", st.State, st.Error)
	}
}
