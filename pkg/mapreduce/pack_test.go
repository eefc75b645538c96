package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// packedTasks returns how many tasks asynq has processed from the env's
// queue.
func (e *env) processedTasks() int {
	e.t.Helper()
	info, err := asynq.NewInspectorFromRedisClient(e.rdb).GetQueueInfo(e.queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return info.ProcessedTotal
}

// wantEachMappedOnce checks that Map ran exactly once for each of pages
// pages of one number each (sumArgs{PageSize: 1}), but for those in again,
// which it ran twice.
func wantEachMappedOnce(t *testing.T, cnt *counts, pages int, again func(i int) bool) {
	t.Helper()
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	bad := 0
	for i := range pages {
		want := 1
		if again != nil && again(i) {
			want = 2
		}
		if got := cnt.maps[i]; got != want && bad < 5 {
			bad++
			t.Errorf("page %d: Map ran %d times, want %d", i, got, want)
		}
	}
}

// wantExactRun waits for a run of pages pages of one number each
// (sumArgs{PageSize: 1}) to succeed with every page done and the exact
// sum, Map run once for each page but those in again (twice).
func wantExactRun(t *testing.T, c *mapreduce.Client, id string, pages int, cnt *counts, again func(int) bool) *mapreduce.Status {
	t.Helper()
	st := wait(t, c, id, time.Minute)
	if st.State != mapreduce.StateSucceeded || st.Done != pages || st.Failed != 0 {
		t.Fatalf("run ended %s with %d done, %d failed (%s); want all %d pages done", st.State, st.Done, st.Failed, st.Error, pages)
	}
	if got, want := resultOf(t, c, st), pages*(pages-1)/2; got != want {
		t.Errorf("result %d, want %d", got, want)
	}
	wantEachMappedOnce(t, cnt, pages, again)
	return st
}

// runCheap runs job over pages pages of one number each to its exact end
// (wantExactRun), and returns the run and how it packed: k pages a task
// from page from.
func runCheap(t *testing.T, c *mapreduce.Client, job mapreduce.Job[sumArgs, span, int, int], pages int, cnt *counts) (id string, k, from int) {
	t.Helper()
	ctx := context.Background()
	id, err := job.Start(ctx, c, sumArgs{N: pages, PageSize: 1}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantExactRun(t, c, id, pages, cnt, nil)
	k, from, err = c.Packing(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return id, k, from
}

func TestCheapPagesGoSeveralToATaskAndEachIsRecordedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages = 3000
	cnt := newCounts()
	job := sumJob("cheap", cnt, e.opts(mapreduce.JobOptions{Window: 1000}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 8)
	ctx := context.Background()
	id, k, from := runCheap(t, c, job, pages, cnt)
	if k < 2 || from < mapreduce.PackSample {
		t.Fatalf("the run packs %d pages a task from page %d: want several, once %d pages were measured", k, from, mapreduce.PackSample)
	}
	if st, err := c.Status(ctx, id); err != nil || st.PagesPerTask != k || st.PackedFrom != from {
		t.Errorf("Status says %d pages a task from page %d (%v), want %d from %d", st.PagesPerTask, st.PackedFrom, err, k, from)
	}
	// One task a page up to from, then groups of k, a split and a reduce.
	if tasks, most := e.processedTasks(), from+(pages-from)/k+8+2; tasks > most {
		t.Errorf("asynq processed %d tasks for %d pages packed by %d from page %d: want at most %d", tasks, pages, k, from, most)
	} else {
		t.Logf("%d pages in %d tasks: packed by %d from page %d", pages, tasks, k, from)
	}
}

func TestPagesThatTakeAMillisecondOrMoreKeepATaskEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	slow := sumJob("slow", newCounts(), e.opts(mapreduce.JobOptions{}))
	inner := slow.Map
	slow.Map = func(ctx context.Context, p span) (int, error) {
		time.Sleep(2 * time.Millisecond) // a query's worth
		return inner(ctx, p)
	}
	off := sumJob("off", newCounts(), e.opts(mapreduce.JobOptions{PagesPerTask: 1}))
	e.addJob(mapreduce.AddJob(e.jobs, slow))
	e.addJob(mapreduce.AddJob(e.jobs, off))
	c := e.client()
	e.worker(c, 16)
	ctx := context.Background()
	for _, job := range []string{"slow", "off"} {
		id := mustStart(t, c, job, sumArgs{N: 400, PageSize: 1}, mapreduce.StartOptions{})
		if st := wait(t, c, id, time.Minute); st.State != mapreduce.StateSucceeded || st.Done != 400 {
			t.Fatalf("%s: run ended %s with %d pages done: %s", job, st.State, st.Done, st.Error)
		}
		if k, from, err := c.Packing(ctx, id); err != nil || k != 0 {
			t.Errorf("%s: the run packs %d pages a task from page %d (%v): want one page a task", job, k, from, err)
		}
	}
	if tasks := e.processedTasks(); tasks < 2*(400+2) {
		t.Errorf("asynq processed %d tasks for two runs of 400 pages: want a task a page", tasks)
	}
}

// packedRun starts a run of pages of one number each that packs by k from
// its first page, and runs its split by hand: its map tasks are pending.
func packedRun(t *testing.T, e *env, c *mapreduce.Client, job string, pages, k int) string {
	t.Helper()
	ctx := context.Background()
	id := mustStart(t, c, job, sumArgs{N: pages, PageSize: 1}, mapreduce.StartOptions{})
	if err := c.SetPacking(ctx, id, k, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	if n, want := len(e.pendingTasks(mapreduce.TypePages)), (pages+k-1)/k; n != want {
		t.Fatalf("%d pending tasks of several pages, want %d", n, want)
	}
	if n := len(e.pendingTasks(mapreduce.TypeMap)); n != 0 {
		t.Fatalf("%d pending tasks of one page, want none", n)
	}
	return id
}

func TestAPageThatFailsInATaskOfSeveralRetriesAndItsNeighboursRunOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages = 40
	cnt := newCounts()
	job := sumJob("flaky", cnt, e.opts(mapreduce.JobOptions{}))
	inner := job.Map
	failOnce := func(i int) bool { return i%5 == 3 }
	job.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mu.Lock()
		first := cnt.maps[p.Lo] == 0
		cnt.mu.Unlock()
		n, _ := inner(ctx, p)
		if i, _ := mapreduce.PageIndex(ctx); i != p.Lo {
			return 0, fmt.Errorf("PageIndex %d in the Map of page %d", i, p.Lo)
		}
		if first && failOnce(p.Lo) {
			return 0, errors.New("first attempt fails")
		}
		return n, nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	id := packedRun(t, e, c, "flaky", pages, 8)
	e.worker(c, 4)
	wantExactRun(t, c, id, pages, cnt, failOnce)
}

func TestAPageThatFailsForGoodInATaskOfSeveralFailsAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages = 40
	cnt := newCounts()
	job := sumJob("doomed", cnt, e.opts(mapreduce.JobOptions{Semantics: mapreduce.CompleteSemantics, MapRetries: 1}))
	inner := job.Map
	bad := func(i int) bool { return i%7 == 2 }
	job.Map = func(ctx context.Context, p span) (int, error) {
		n, _ := inner(ctx, p)
		if bad(p.Lo) {
			return 0, fmt.Errorf("page %d is bad", p.Lo)
		}
		return n, nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	id := packedRun(t, e, c, "doomed", pages, 8)
	e.worker(c, 4)
	st := wait(t, c, id, 30*time.Second)
	wantFailed := 0
	for i := range pages {
		if bad(i) {
			wantFailed++
		}
	}
	if st.State != mapreduce.StateSucceeded || st.Failed != wantFailed || st.Done != pages-wantFailed {
		t.Fatalf("run ended %s with %d done, %d failed: %s; want succeeded, %d failed", st.State, st.Done, st.Failed, st.Error, wantFailed)
	}
	wantEachMappedOnce(t, cnt, pages, bad) // one retry for the bad pages, none for the others
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	if len(cnt.reduced) != pages {
		t.Fatalf("Reduce saw %d pages, want %d", len(cnt.reduced), pages)
	}
	for _, pr := range cnt.reduced {
		switch {
		case bad(pr.Index) && (pr.Err == nil || !strings.Contains(pr.Err.Error(), fmt.Sprintf("page %d is bad", pr.Index)) || pr.Page.Lo != pr.Index):
			t.Errorf("page %d: error %v, page %+v; want its own error and descriptor", pr.Index, pr.Err, pr.Page)
		case !bad(pr.Index) && (pr.Err != nil || pr.Result != pr.Index):
			t.Errorf("page %d: result %d, error %v; want %d", pr.Index, pr.Result, pr.Err, pr.Index)
		}
	}
}

func TestATaskOfSeveralPagesDeliveredTwiceRecordsThemOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("twice", cnt, e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	id := packedRun(t, e, c, "twice", 20, 4)
	ctx := context.Background()
	ti := e.pendingTasks(mapreduce.TypePages)[0]
	for range 2 {
		if err := c.ProcessTask(ctx, task(ti)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Done != 4 {
		t.Errorf("%d pages done after one task of 4 ran twice, want 4", st.Done)
	}
	if calls, _ := cnt.snapshot(); calls != 4 {
		t.Errorf("Map ran %d times for a task of 4 pages delivered twice, want 4", calls)
	}
}

func TestAnOrphanedTaskOfSeveralPagesIsCopied(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	id := packedRun(t, e, c, "sum", 20, 4)
	lost := e.pendingTasks(mapreduce.TypePages)[0]
	e.takeWithoutHandler(lost.ID)
	if n := scanOrphans(t, e, c, 2); n != 1 {
		t.Fatalf("%d copies of an orphaned task of 4 pages, want 1", n)
	}
	copies := 0
	for _, ti := range e.pendingTasks(mapreduce.TypePages) {
		if strings.HasPrefix(ti.ID, lost.ID+"~") {
			copies++
			if string(ti.Payload) != string(lost.Payload) {
				t.Errorf("the copy carries %s, want the orphan's %s", ti.Payload, lost.Payload)
			}
		}
	}
	if copies != 1 {
		t.Fatalf("%d pending copies of %s, want 1", copies, lost.ID)
	}
	e.worker(c, 2)
	if st := wait(t, c, id, 10*time.Second); st.State != mapreduce.StateSucceeded || st.Done != 20 {
		t.Fatalf("run ended %s with %d done: %s", st.State, st.Done, st.Error)
	}
}

func TestPagesPerTaskMustBeAPowerOfTwoUpTo64(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, 3, 12, 128} {
		err := mapreduce.AddJob(mapreduce.NewJobs(), sumJob("bad", nil, mapreduce.JobOptions{PagesPerTask: n}))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("PagesPerTask %d: use a power of two up to 64", n)) {
			t.Errorf("PagesPerTask %d: %v, want an error that names the fix", n, err)
		}
	}
	for _, n := range []int{0, 1, 2, 64} {
		if err := mapreduce.AddJob(mapreduce.NewJobs(), sumJob("good", nil, mapreduce.JobOptions{PagesPerTask: n})); err != nil {
			t.Errorf("PagesPerTask %d: %v", n, err)
		}
	}
}

// failSplitDone is a go-redis hook that fails, once, the split's record of
// its total (splitdone.lua) without sending it, as a worker killed after
// its split's last feed and before the total would leave it.
type failSplitDone struct{ fired atomic.Bool }

func (h *failSplitDone) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failSplitDone) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if mapreduce.IsSplitDone(cmd.Args()) && h.fired.CompareAndSwap(false, true) {
			err := errors.New("injected: the worker died before recording the total")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h *failSplitDone) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	// The total goes in a pipeline with other handlers' calls, which go
	// on without it.
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var kept []redis.Cmder
		var failed error
		for _, cmd := range cmds {
			if mapreduce.IsSplitDone(cmd.Args()) && h.fired.CompareAndSwap(false, true) {
				failed = errors.New("injected: the worker died before recording the total")
				cmd.SetErr(failed)
				continue
			}
			kept = append(kept, cmd)
		}
		if failed == nil {
			return next(ctx, cmds)
		}
		if len(kept) > 0 {
			if err := next(ctx, kept); err != nil {
				return err
			}
		}
		return failed
	}
}

// growingSplit emits a.N pages of one number each on its first attempt
// and three more on every attempt after, as a keyset split over a table
// that grew does; attempts counts them.
// failPage makes job's Map fail page lo every time, with "page <lo> is
// bad", and map the others as before.
func failPage(job *mapreduce.Job[sumArgs, span, int, int], lo int) {
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == lo {
			return 0, fmt.Errorf("page %d is bad", lo)
		}
		return inner(ctx, p)
	}
}

func growingSplit(attempts *atomic.Int32) func(context.Context, sumArgs, func(span) error) error {
	return func(ctx context.Context, a sumArgs, emit func(span) error) error {
		n := a.N
		if attempts.Add(1) > 1 {
			n += 3
		}
		for lo := range n {
			if err := emit(span{lo, lo + 1}); err != nil {
				return err
			}
		}
		return nil
	}
}

// A split's last feed ends inside a block (pages 8–9 of 8–11), the split
// stops before recording its total, and Split, run again, emits three
// more pages (the table grew). The group task of 8–9 is still pending
// then: pages 10 and 11 cannot go under its ID, and must not be lost.
func TestASplitThatEmitsMorePagesAfterItsLastFeedLosesNone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("grows", cnt, e.opts(mapreduce.JobOptions{}))
	var attempts atomic.Int32
	job.Split = growingSplit(&attempts)
	gate := make(chan struct{})
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == 8 {
			<-gate // the group of 8–9 stays in asynq until the second split is done
		}
		return inner(ctx, p)
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	hook := &failSplitDone{}
	c := e.hookedClient(hook)
	ctx := context.Background()
	id := mustStart(t, c, "grows", sumArgs{N: 10, PageSize: 1}, mapreduce.StartOptions{})
	if err := c.SetPacking(ctx, id, 4, 0); err != nil {
		t.Fatal(err)
	}
	e.worker(c, 4)
	testenv.WaitFor(t, 30*time.Second, "the second split to record the total", func() bool {
		st, err := c.Status(ctx, id)
		return err == nil && st.Total >= 0
	})
	close(gate)
	wantExactRun(t, c, id, 13, cnt, nil)
	if !hook.fired.Load() || attempts.Load() < 2 {
		t.Fatalf("the split's total was never lost (%v, %d attempts), so this test proves nothing", hook.fired.Load(), attempts.Load())
	}
}

// Each page of a task of several ends its Observer step with what became
// of it: recorded (nil), failed for good (SkipRetry), or retried.
func TestTheObserverSeesEachPageOfATaskOfSeveralEndAsItDid(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := sumJob("seen", newCounts(), e.opts(mapreduce.JobOptions{MapRetries: -1, Semantics: mapreduce.CompleteSemantics}))
	failPage(&job, 2)
	e.addJob(mapreduce.AddJob(e.jobs, job))
	log := &stepLog{}
	c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, Observer: log})
	if err != nil {
		t.Fatal(err)
	}
	id := packedRun(t, e, c, "seen", 4, 4)
	e.worker(c, 1)
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded || st.Done != 3 || st.Failed != 1 {
		t.Fatalf("run ended %s with %d done, %d failed (%s); want page 2 failed", st.State, st.Done, st.Failed, st.Error)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	seen := map[int]error{}
	for _, s := range log.steps {
		if s.Kind == mapreduce.StepMap && s.Run == id {
			seen[s.Page] = s.err
		}
	}
	for i := range 4 {
		err, ok := seen[i]
		switch {
		case !ok:
			t.Errorf("page %d: no step ended", i)
		case i == 2 && !errors.Is(err, asynq.SkipRetry):
			t.Errorf("page 2 ended with %v, want its failure marked final (SkipRetry)", err)
		case i != 2 && err != nil:
			t.Errorf("page %d ended with %v, want nil: it was recorded", i, err)
		}
	}
}

// A transient failure beside a page that fails for good spends none of the
// job's retries: the transient page runs again and succeeds.
func TestATransientFailureBesideAFinalOneInATaskOfSeveralIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("mixed", cnt, e.opts(mapreduce.JobOptions{MapRetries: -1, Semantics: mapreduce.CompleteSemantics,
		TransientBackoff: func(int) time.Duration { return 10 * time.Millisecond }}))
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mu.Lock()
		first := cnt.maps[p.Lo] == 0
		cnt.mu.Unlock()
		n, _ := inner(ctx, p)
		switch {
		case p.Lo == 3 && first:
			return 0, mapreduce.Transient(errors.New("the database restarted"))
		case p.Lo == 5:
			return 0, errors.New("page 5 is bad")
		}
		return n, nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	id := packedRun(t, e, c, "mixed", 8, 8)
	e.worker(c, 2)
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 7 || st.Failed != 1 {
		t.Fatalf("run ended %s with %d done, %d failed (%s); want 7 done and page 5 failed", st.State, st.Done, st.Failed, st.Error)
	}
	wantEachMappedOnce(t, cnt, 8, func(i int) bool { return i == 3 })
}

// A task of several pages whose deadline passes while a page overruns it
// does not fail the pages it never started: they run on its retry.
func TestPagesATaskNeverStartedBeforeItsDeadlineAreNotFailed(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a 4 s task deadline")
	}
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("late", cnt, e.opts(mapreduce.JobOptions{MapRetries: -1, MapTimeout: time.Second, Semantics: mapreduce.CompleteSemantics}))
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mu.Lock()
		first := cnt.maps[p.Lo] == 0
		cnt.mu.Unlock()
		n, _ := inner(ctx, p)
		if p.Lo == 0 && first {
			// Ignores its context: returns past the task's 4 s deadline,
			// once asynq has taken the task back for its retry.
			<-ctx.Done()
			id, _ := asynq.GetTaskID(ctx)
			testenv.Eventually(5*time.Second, func() bool {
				ti, err := insp.GetTaskInfo(e.queue, id)
				return err == nil && (ti.Retried > 0 || ti.State != asynq.TaskStateActive)
			})
			return n, nil
		}
		return n, ctx.Err()
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	id := packedRun(t, e, c, "late", 4, 4)
	e.worker(c, 2)
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 4 || st.Failed != 0 {
		t.Fatalf("run ended %s with %d done, %d failed (%s); want all 4 pages done", st.State, st.Done, st.Failed, st.Error)
	}
	for i := 1; i < 4; i++ {
		if n := cnt.maps[i]; n != 1 {
			t.Errorf("page %d: Map ran %d times, want once, on the task's retry", i, n)
		}
	}
}

// A lone page (fed one a task after a split's last feed ended mid-block)
// whose own task is still pending must not be failed by the reconciler
// because its block's group task is archived.
func TestAPageFedAloneAfterItsBlocksGroupIsNotFailedWhileItsOwnTaskWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("grows", cnt, e.opts(mapreduce.JobOptions{MapRetries: -1, Semantics: mapreduce.CompleteSemantics}))
	var attempts atomic.Int32
	job.Split = growingSplit(&attempts)
	failPage(&job, 8)
	e.addJob(mapreduce.AddJob(e.jobs, job))
	hook := &failSplitDone{}
	rdb := redis.NewClient(e.rdb.Options())
	rdb.AddHook(hook)
	t.Cleanup(func() { rdb.Close() })
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, StuckAfter: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	id := mustStart(t, c, "grows", sumArgs{N: 10, PageSize: 1}, mapreduce.StartOptions{})
	if err := c.SetPacking(ctx, id, 4, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err == nil {
		t.Fatal("first split: want the injected failure")
	}
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{mapreduce.TypeMap, mapreduce.TypePages} {
		for _, ti := range e.pendingTasks(typ) {
			switch {
			case strings.HasSuffix(ti.ID, ":pages:8"):
				_ = c.ProcessTask(ctx, task(ti))                         // page 8 fails (by hand, not for good), 9 is recorded
				if err := insp.ArchiveTask(e.queue, ti.ID); err != nil { // as asynq does with SkipRetry
					t.Fatal(err)
				}
			case strings.HasSuffix(ti.ID, ":map:10"):
				// still pending (waiting for a worker, or a retry)
			default:
				if err := c.ProcessTask(ctx, task(ti)); err != nil {
					t.Fatal(err)
				}
				if err := insp.DeleteTask(e.queue, ti.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// Once the run has recorded nothing for StuckAfter, a pass repairs it.
	var rep mapreduce.Repairs
	testenv.WaitFor(t, 10*time.Second, "a pass to find the run stuck", func() bool {
		rep, err = c.Reconcile(ctx)
		return err != nil || rep.PagesFailed != 0
	})
	if err != nil || rep.PagesFailed != 1 {
		t.Errorf("the reconciler failed %d pages (%v); want 1, page 8, whose group task was archived: page 10's own task is pending", rep.PagesFailed, err)
	}
	if st, err := c.Status(ctx, id); err != nil || st.Done+st.Failed != 12 {
		t.Errorf("%d pages done and %d failed (%v), want every page but 10 recorded", st.Done, st.Failed, err)
	}
}

// A run cancelled while a task of several pages runs: the pages that ran
// before are not recorded, so their steps must not end nil (success).
func TestAPackedTaskCutShortByCancelEndsEachStepWithErrRunCancelled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := sumJob("cx", newCounts(), e.opts(mapreduce.JobOptions{}))
	inner := job.Map
	started := make(chan struct{})
	job.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == 1 {
			close(started)
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return inner(ctx, p)
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	log := &stepLog{}
	c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, Observer: log, CancelPoll: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := packedRun(t, e, c, "cx", 4, 4)
	ti := e.pendingTasks(mapreduce.TypePages)[0]
	done := make(chan error, 1)
	go func() { done <- c.ProcessTask(ctx, task(ti)) }()
	<-started
	if err := c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, s := range log.steps {
		if s.Kind == mapreduce.StepMap && s.Run == id {
			if !errors.Is(s.err, mapreduce.ErrRunCancelled) {
				t.Errorf("page %d ended with %v; want ErrRunCancelled (not recorded)", s.Page, s.err)
			}
		}
	}
}

// A run that packs by more pages than its window now holds (a deploy that
// shrank Window mid-run) still feeds, a group at a time.
func TestARunThatPacksByMoreThanItsWindowHoldsStillFeeds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	job := sumJob("shrunk", cnt, e.opts(mapreduce.JobOptions{Window: 16}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	id := mustStart(t, c, "shrunk", sumArgs{N: 300, PageSize: 1}, mapreduce.StartOptions{})
	if err := c.SetPacking(ctx, id, 64, 0); err != nil { // as a worker with a larger window decided
		t.Fatal(err)
	}
	e.worker(c, 4)
	wantExactRun(t, c, id, 300, cnt, nil)
}

// Nothing is measured before a worker takes a task, so a split that fed
// on regardless sent its whole first window of cheap pages a page a task
// while its workers slept out their poll interval (100 ms, the worker
// command's default): ~1 s of a 2 s, 100 000-page run. It now feeds
// ProbePages pages that way, then waits for the first measured ones, and
// packs from there.
func TestASplitOfCheapPagesPacksAfterItsFirstFewHundredPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages = 5000
	cnt := newCounts()
	job := sumJob("probe", cnt, e.opts(mapreduce.JobOptions{}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.workerPolling(c, 8, 100*time.Millisecond)
	_, k, from := runCheap(t, c, job, pages, cnt)
	// The decision comes with the feed after the probe's pages: at most
	// one feed (256 pages) later.
	if k < 2 || from < mapreduce.ProbePages || from > 2*mapreduce.ProbePages {
		t.Fatalf("the run packs %d pages a task from page %d: want several, from page %d to %d", k, from, mapreduce.ProbePages, 2*mapreduce.ProbePages)
	}
	t.Logf("packed by %d from page %d", k, from)
}

// The probe's wait ends once the workers have taken every task fed, rather
// than at its bound: pages not measured by then are not cheap, and a fleet
// with more slots than the probe's pages would idle meanwhile. Here no page
// ends while the test watches, and the bound is a minute: the split must
// feed the rest of the run all the same. (Not parallel: it sets the bound,
// a package variable.)
func TestAProbeWhoseTasksAreAllTakenFeedsOnWithoutWaitingForThem(t *testing.T) {
	defer mapreduce.SetProbeWait(time.Minute)()
	e := newEnv(t)
	const pages = 600
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	cnt := newCounts()
	job := sumJob("slowstart", cnt, e.opts(mapreduce.JobOptions{}))
	gateMap(&job, gate)
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, pages+8) // a slot for every page, and the split's
	ctx := context.Background()
	id, err := job.Start(ctx, c, sumArgs{N: pages, PageSize: 1}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	var queued int
	testenv.WaitFor(t, 30*time.Second, "every page's task enqueued while none has ended", func() bool {
		info, err := insp.GetQueueInfo(e.queue)
		if err != nil {
			t.Fatal(err)
		}
		queued = info.Pending + info.Active
		return queued >= pages // and the split, active
	})
	open()
	wantExactRun(t, c, id, pages, cnt, nil)
	if k, from, err := c.Packing(ctx, id); err != nil || k > 1 {
		t.Errorf("the run packs %d pages a task from page %d (%v): want a task a page, none measured when it decided", k, from, err)
	}
}
