package mapreduce_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// Cancel stops a run: Maps at work see their context cancelled with cause
// ErrRunCancelled, no Map starts afterwards, the split stops enqueuing,
// Reduce never runs, and the run ends cancelled.
func TestCancelStopsTheRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client()
	var started, afterCancel atomic.Int32
	var cancelled atomic.Bool
	causes := make(chan error, 100)
	var reduces, splits atomic.Int32
	splitReturned := make(chan struct{})
	// A window of 20 pages holds the endless split back while the Maps
	// work.
	j := sumJob("long", newCounts(), e.opts(mapreduce.JobOptions{Window: 20}))
	j.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		if splits.Add(1) == 1 {
			defer close(splitReturned)
		}
		for lo := 0; ; lo++ { // endless: only the cancellation stops it
			if err := emit(span{lo, lo + 1}); err != nil {
				return err
			}
		}
	}
	j.Map = func(ctx context.Context, p span) (int, error) {
		started.Add(1)
		if cancelled.Load() {
			afterCancel.Add(1)
		}
		<-ctx.Done() // work until stopped
		causes <- context.Cause(ctx)
		return 0, ctx.Err()
	}
	j.Reduce = func(context.Context, sumArgs, iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
		reduces.Add(1)
		return 0, nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	e.worker(c, 4) // the endless split takes one slot
	id := mustStart(t, c, "long", sumArgs{}, mapreduce.StartOptions{})
	testenv.WaitFor(t, 10*time.Second, "three Maps at work", func() bool { return started.Load() == 3 })

	if err := c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	cancelled.Store(true)
	for range 3 {
		select {
		case cause := <-causes:
			if !errors.Is(cause, mapreduce.ErrRunCancelled) {
				t.Errorf("a Map's context ended with cause %v, want ErrRunCancelled", cause)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a Map at work was not cancelled")
		}
	}
	st, err := c.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != mapreduce.StateCancelled {
		t.Fatalf("state %s, want cancelled", st.State)
	}
	// The split stops: once it has returned, and the worker has drained
	// what it had enqueued (none of which may run), no task is left to
	// come.
	select {
	case <-splitReturned:
	case <-time.After(10 * time.Second):
		t.Fatal("the split kept on after the cancel")
	}
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	testenv.WaitFor(t, 10*time.Second, "the queue to drain", func() bool {
		q, err := insp.GetQueueInfo(e.queue)
		return err == nil && q.Pending == 0 && q.Active == 0 && q.Scheduled == 0 && q.Retry == 0
	})
	if n := splits.Load(); n != 1 {
		t.Errorf("Split ran %d times, want once: the cancelled run's split was run again", n)
	}
	if n := afterCancel.Load(); n != 0 {
		t.Errorf("%d Maps started after Cancel returned", n)
	}
	if n := reduces.Load(); n != 0 {
		t.Errorf("Reduce ran %d times for a cancelled run", n)
	}
	if err := c.Cancel(context.Background(), id); err != nil {
		t.Errorf("cancelling twice: %v", err)
	}
}

func TestCancelOfAnEndedOrUnknownRunSaysSo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	e.worker(c, 2)
	id := mustStart(t, c, "sum", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	wait(t, c, id, 30*time.Second)
	if err := c.Cancel(context.Background(), id); !errors.Is(err, mapreduce.ErrRunEnded) {
		t.Errorf("cancel of a succeeded run: %v, want ErrRunEnded", err)
	}
	if err := c.Cancel(context.Background(), "sum:nope"); !errors.Is(err, mapreduce.ErrRunNotFound) {
		t.Errorf("cancel of an unknown run: %v, want ErrRunNotFound", err)
	}
	if _, err := c.Status(context.Background(), "not a run id"); err == nil || !strings.Contains(err.Error(), "<job>:<key>") {
		t.Errorf("status of a malformed ID: %v", err)
	}
}

// Two schedulers firing on the same tick call Start with the same Key: one
// run, whichever call wins; the other learns it exists.
func TestStartsWithTheSameKeyMakeOneRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("nightly", cnt, e.opts(mapreduce.JobOptions{}))))
	a, b := e.client(), e.client() // two scheduler replicas
	key := "tick-2026-11-21T06:00:00Z"
	ids := make([]string, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := a
			if i%2 == 1 {
				c = b
			}
			ids[i], errs[i] = c.StartAny(context.Background(), "nightly", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{Key: key})
		}()
	}
	wg.Wait()
	created := 0
	for i := range ids {
		if ids[i] != "nightly:"+key {
			t.Errorf("Start %d returned ID %q", i, ids[i])
		}
		switch {
		case errs[i] == nil:
			created++
		case !errors.Is(errs[i], mapreduce.ErrRunExists):
			t.Errorf("Start %d: %v", i, errs[i])
		}
	}
	if created != 1 {
		t.Fatalf("%d Starts created a run, want exactly 1", created)
	}
	e.worker(a, 4)
	st := wait(t, a, "nightly:"+key, 30*time.Second)
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("state %s (%s)", st.State, st.Error)
	}
	runs, err := a.Runs(context.Background(), "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if _, reduces := cnt.snapshot(); len(runs) != 1 || reduces != 1 {
		t.Errorf("%d runs listed and %d reduces, want 1 and 1", len(runs), reduces)
	}
}

func TestOverlappingRunsAreRefusedUnlessAllowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("solo", newCounts(), e.opts(mapreduce.JobOptions{}))))
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("many", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c := e.client()
	ctx := context.Background()
	first := mustStart(t, c, "solo", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	_, err := c.StartAny(ctx, "solo", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	if !errors.Is(err, mapreduce.ErrRunActive) || !strings.Contains(err.Error(), first) {
		t.Fatalf("second Start while the first runs: %v, want ErrRunActive naming %s", err, first)
	}
	mustStart(t, c, "many", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	mustStart(t, c, "many", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})

	e.worker(c, 4)
	wait(t, c, first, 30*time.Second)
	second := mustStart(t, c, "solo", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	if st := wait(t, c, second, 30*time.Second); st.State != mapreduce.StateSucceeded {
		t.Fatalf("the run after the first ended: %s (%s)", st.State, st.Error)
	}
	runs, err := c.Runs(ctx, "many")
	if err != nil || len(runs) != 2 {
		t.Fatalf("Runs(many) = %d runs, %v; want 2", len(runs), err)
	}
	for _, st := range runs {
		wait(t, c, st.ID, 30*time.Second)
	}
}

// A task whose payload cannot be decoded, or of a type batchmr does not
// know, is archived at once with a message saying so, not retried.
func TestMalformedTasksAreArchivedAtOnceWithAClearError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("known", newCounts(), e.opts(mapreduce.JobOptions{}))))
	worker := e.client()
	aq := asynq.NewClientFromRedisClient(e.rdb)
	t.Cleanup(func() { _ = aq.Close() })
	tasks := []*asynq.Task{
		asynq.NewTask(mapreduce.TypeMap, []byte(`{not json`)),
		asynq.NewTask(mapreduce.TypeMap, []byte(`{"run":"no-colon","i":0,"page":1}`)),
		asynq.NewTask(mapreduce.TypeMap, []byte(`{"run":"known:x","i":-1,"page":1}`)),
		asynq.NewTask("batchmr:", nil),
		asynq.NewTask("batchmr:MAP", []byte(`{}`)),
	}
	for _, task := range tasks {
		if _, err := aq.Enqueue(task, asynq.Queue(e.queue), asynq.MaxRetry(5)); err != nil {
			t.Fatal(err)
		}
	}
	e.worker(worker, 2)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	var archived []*asynq.TaskInfo
	testenv.WaitFor(t, 10*time.Second, "five archived tasks", func() bool {
		archived, _ = insp.ListArchivedTasks(e.queue)
		return len(archived) == len(tasks)
	})
	for _, ti := range archived {
		want := "malformed"
		if ti.Type != mapreduce.TypeMap {
			want = "not batchmr's"
		}
		if ti.Retried != 0 || !strings.Contains(ti.LastErr, want) {
			t.Errorf("archived %s after %d retries with error %q; want at once, saying %q", ti.Type, ti.Retried, ti.LastErr, want)
		}
	}
}

// A task that reaches a worker without its job (two jobs sharing a queue)
// is handed back: the run does not fail and the task spends none of its
// retries, however often it is handed back, and a worker that runs the job
// completes the run.
func TestATaskOfAJobTheWorkerDoesNotRunIsHandedBackWithoutSpendingRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("known", newCounts(), e.opts(mapreduce.JobOptions{StepRetries: -1, MapRetries: -1}))))
	host := e.client()
	// A worker of another job, serving the same queue.
	others := mapreduce.NewJobs()
	e.addJob(mapreduce.AddJob(others, sumJob("other", newCounts(), e.opts(mapreduce.JobOptions{}))))
	stranger, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: others, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	id := mustStart(t, host, "known", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	task := e.taskOf(mapreduce.TypeSplit, id)
	ctx := context.Background()
	for range 3 {
		err := stranger.ProcessTask(ctx, asynq.NewTask(task.Type, task.Payload))
		if err == nil || stranger.IsFailure(err) || !strings.Contains(err.Error(), `job "known"`) {
			t.Fatalf("a task of a job the worker does not run: %v (a failure: %v); want handed back, naming the job", err, stranger.IsFailure(err))
		}
		if d := stranger.RetryDelay(0, err, asynq.NewTask(task.Type, task.Payload)); d < time.Second || d > 10*time.Second {
			t.Errorf("a handed-back task is offered again after %v, want a few seconds", d)
		}
	}
	// Through a real server: handed back without a retry spent, the run
	// still splitting.
	strangerSrv := e.worker(stranger, 1)
	testenv.WaitFor(t, 10*time.Second, "the split handed back", func() bool {
		ti, err := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo(e.queue, task.ID)
		return err == nil && ti.State == asynq.TaskStateRetry
	})
	ti, _ := asynq.NewInspectorFromRedisClient(e.rdb).GetTaskInfo(e.queue, task.ID)
	if ti.Retried != 0 {
		t.Errorf("the handed-back split spent %d retries, want 0", ti.Retried)
	}
	if st, _ := host.Status(ctx, id); st.State != mapreduce.StateSplitting {
		t.Fatalf("the run after a hand-back: %s %q, want still splitting", st.State, st.Error)
	}
	// The retry is due within seconds; the job's own worker takes it
	// (with the stranger gone, so that the test's time does not depend on
	// which of the two draws each task).
	strangerSrv.Shutdown()
	e.worker(host, 2)
	if st := wait(t, host, id, 30*time.Second); st.State != mapreduce.StateSucceeded || resultOf(t, host, st) != 45 {
		t.Errorf("run after its tasks were handed back: %s %q", st.State, st.Error)
	}
}

// positiveArgs is a job's Validate: what the command line gets wrong.
func positiveArgs(a sumArgs) error {
	if a.PageSize < 1 {
		return fmt.Errorf("PageSize %d: use at least 1", a.PageSize)
	}
	return nil
}

func TestStartChecksTheJobTheArgumentsAndTheKeyBeforeCreatingAnything(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))
	job.Validate = positiveArgs
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	if _, err := c.StartJSON(ctx, "summ", nil, mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrUnknownJob) || !strings.Contains(err.Error(), `"summ"`) {
		t.Errorf("unknown job: %v", err)
	}
	for _, tc := range []struct{ args, want string }{
		{`"ten"`, "sumArgs"},
		{`{"N": 10, "PageSiz": 5}`, `unknown field "PageSiz"`},
		{`{"N": "ten"}`, "sumArgs"},
		{`{"N": 10, "PageSize": -5}`, "PageSize -5: use at least 1"},
	} {
		if _, err := c.StartJSON(ctx, "sum", json.RawMessage(tc.args), mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrInvalidArgs) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartJSON(%s): %v; want ErrInvalidArgs saying %q", tc.args, err, tc.want)
		}
	}
	if _, err := job.Start(ctx, c, sumArgs{N: 10}, mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrInvalidArgs) || !strings.Contains(err.Error(), "PageSize 0") {
		t.Errorf("typed Start of invalid arguments: %v", err)
	}
	if _, err := job.Start(ctx, c, sumArgs{N: 1, PageSize: 1}, mapreduce.StartOptions{Key: "a key with spaces"}); err == nil || !strings.Contains(err.Error(), "Key") {
		t.Errorf("bad key: %v", err)
	}
	if runs, err := c.Runs(ctx, "sum"); err != nil || len(runs) != 0 {
		t.Fatalf("refused starts created %d runs (%v), want none", len(runs), err)
	}
	typed, err := job.Start(ctx, c, sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatalf("typed Start: %v", err)
	}
	fromJSON, err := c.StartJSON(ctx, "sum", json.RawMessage(`{"N": 20, "PageSize": 5}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatalf("good JSON arguments: %v", err)
	}
	e.worker(c, 2)
	for id, want := range map[string]int{typed: 45, fromJSON: 190} {
		st := wait(t, c, id, 30*time.Second)
		if got, err := job.Result(st); err != nil || got != want {
			t.Errorf("run %s: result %d (%v), want %d", id, got, err, want)
		}
	}
	if _, err := sumJob("other", nil, mapreduce.JobOptions{}).Result(wait(t, c, typed, time.Second)); err == nil || !strings.Contains(err.Error(), `not "other"`) {
		t.Errorf("Result of another job's run: %v", err)
	}
}

func TestAddJobRejectsInvalidJobs(t *testing.T) {
	t.Parallel()
	jobs := mapreduce.NewJobs()
	ok := sumJob("ok", newCounts(), mapreduce.JobOptions{})
	if err := mapreduce.AddJob(jobs, ok); err != nil {
		t.Fatal(err)
	}
	bad := func(mutate func(*mapreduce.Job[sumArgs, span, int, int]), want string) {
		t.Helper()
		j := sumJob("other", newCounts(), mapreduce.JobOptions{})
		mutate(&j)
		if err := mapreduce.AddJob(jobs, j); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("AddJob: %v, want an error saying %q", err, want)
		}
	}
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Name = "ok" }, "already registered")
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Name = "has:colon" }, "[A-Za-z0-9_.-]")
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Name = "" }, "[A-Za-z0-9_.-]")
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Map = nil }, "Split and Map")
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Options.Retention = -time.Second }, "Retention")
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Options.Semantics = 7 }, "Semantics")
	bad(func(j *mapreduce.Job[sumArgs, span, int, int]) { j.Options.MapTimeout = 300 * time.Millisecond }, "whole seconds")
	if _, err := mapreduce.New(nil, mapreduce.Config{Jobs: jobs}); err == nil {
		t.Error("New with a nil redis client succeeded")
	}
}

// A finished run's keys expire after the job's retention, the job's run
// index forgets it, and nothing else of it stays behind: many runs leave
// nothing growing.
func TestFinishedRunsExpireAndLeaveNothingBehind(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Longer than Wait's longest poll (1s), so that a run is seen ended
	// before it expires however loaded the machine.
	const retention = 3 * time.Second
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("brief", newCounts(), e.opts(mapreduce.JobOptions{Retention: retention}))))
	c := e.client()
	e.worker(c, 4)
	ctx := context.Background()
	var ids []string
	for range 5 {
		id := mustStart(t, c, "brief", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
		if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded {
			t.Fatalf("run %s: %s (%s)", id, st.State, st.Error)
		}
		ids = append(ids, id)
	}
	// Every key of a finished run has a TTL within the retention.
	keys, err := e.rdb.Keys(ctx, e.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		ttl := e.rdb.PTTL(ctx, k).Val()
		if strings.HasSuffix(k, ":runs") {
			continue // the job's index, trimmed by Start
		}
		if strings.Contains(k, ":claim:") {
			// A handler's mark of its attempt: a page's goes when it is
			// recorded, a split's or reduce's lives its few seconds.
			if ttl <= 0 || ttl > mapreduce.OrphanGrace || strings.Contains(k, ":map:") {
				t.Errorf("key %s has TTL %v: a split's or reduce's mark lives at most %v, a page's goes when it is recorded", k, ttl, mapreduce.OrphanGrace)
			}
			continue
		}
		if ttl <= 0 || ttl > retention {
			t.Errorf("key %s has TTL %v, want (0, %v]", k, ttl, retention)
		}
	}
	for _, id := range ids {
		testenv.WaitFor(t, retention+5*time.Second, "run "+id+" to expire after its retention", func() bool {
			_, err := c.Status(ctx, id)
			return errors.Is(err, mapreduce.ErrRunNotFound)
		})
	}
	// The next Start trims the index down to itself.
	last := mustStart(t, c, "brief", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	wait(t, c, last, 30*time.Second)
	runs, err := c.Runs(ctx, "brief")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].ID != last {
		t.Errorf("Runs after expiry: %d runs, want only %s", len(runs), last)
	}
	var zcard int64
	for _, k := range keys {
		if strings.HasSuffix(k, ":runs") {
			zcard = e.rdb.ZCard(ctx, k).Val()
		}
	}
	if zcard != 1 {
		t.Errorf("the job's run index holds %d entries, want 1", zcard)
	}
}

// The handler that records the last page moves the run to reducing and
// then enqueues the reduce; if it dies in between, the reconciler enqueues
// it. Likewise for a Start that died before enqueuing the split.
func TestReconcilerRepairsLostEnqueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", cnt, e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c := e.client()
	ctx := context.Background()
	insp := asynq.NewInspectorFromRedisClient(e.rdb)

	// A run whose split task is lost.
	lostSplit := mustStart(t, c, "sum", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{Key: "lost-split"})
	if err := insp.DeleteTask(e.queue, e.taskOf(mapreduce.TypeSplit, lostSplit).ID); err != nil {
		t.Fatal(err)
	}
	// A run whose reduce task is lost: run its split and pages by hand, then
	// delete the reduce the last page enqueued.
	lostReduce := mustStart(t, c, "sum", sumArgs{N: 10, PageSize: 5}, mapreduce.StartOptions{Key: "lost-reduce"})
	for _, typ := range []string{mapreduce.TypeSplit, mapreduce.TypeMap} {
		for _, ti := range e.pendingTasks(typ) {
			if strings.HasPrefix(ti.ID, lostReduce) {
				if err := c.ProcessTask(ctx, task(ti)); err != nil {
					t.Fatal(err)
				}
				if err := insp.DeleteTask(e.queue, ti.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := insp.DeleteTask(e.queue, e.taskOf(mapreduce.TypeReduce, lostReduce).ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Status(ctx, lostReduce); st.State != mapreduce.StateReducing {
		t.Fatalf("state %s, want reducing", st.State)
	}

	rep, err := c.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.SplitsEnqueued != 1 || rep.ReducesEnqueued != 1 {
		t.Fatalf("repairs %+v, want one split and one reduce enqueued", rep)
	}
	// A second pass finds nothing to do: the tasks exist now.
	if rep, err := c.Reconcile(ctx); err != nil || rep != (mapreduce.Repairs{}) {
		t.Fatalf("second pass: %+v, %v; want nothing", rep, err)
	}
	e.worker(c, 4)
	for _, id := range []string{lostSplit, lostReduce} {
		st := wait(t, c, id, 30*time.Second)
		if st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 45 {
			t.Errorf("run %s: %s (%s), want succeeded with 45", id, st.State, st.Error)
		}
	}
}

// A starter built with another version of a job's code (its arguments
// renamed a field) starts a run that the workers' version cannot read:
// the run fails at its split, naming the field, instead of running with
// zero values and succeeding over no pages.
func TestARunStartedWithAnotherVersionsArgumentsFailsNamingTheField(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("versioned", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	e.worker(c, 2)
	type oldArgs struct{ Count, PageSize int }
	old := mapreduce.Job[oldArgs, span, int, int]{
		Name:  "versioned",
		Split: func(context.Context, oldArgs, func(span) error) error { return nil },
		Map:   func(context.Context, span) (int, error) { return 0, nil },
		// The same options as the workers' version: the same queue.
		Options: e.opts(mapreduce.JobOptions{}),
	}
	id, err := old.Start(context.Background(), c, oldArgs{Count: 10, PageSize: 5}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, `unknown field "Count"`) || !strings.Contains(st.Error, "sumArgs") {
		t.Errorf("the run %s (error %q), want failed, naming the unknown field and the workers' argument type", st.State, st.Error)
	}
}

// Types whose values JSON would lose or never decode are refused when the
// job is added, naming the type and the fix; what JSON carries is not.
type (
	hiddenSpan  struct{ lo, hi int }
	shape       interface{ Area() float64 }
	customSpan  struct{ lo, hi int }
	embeddedArg struct{ sumArgs }
)

func (c customSpan) MarshalJSON() ([]byte, error) { return json.Marshal([2]int{c.lo, c.hi}) }
func (c *customSpan) UnmarshalJSON(b []byte) error {
	var a [2]int
	err := json.Unmarshal(b, &a)
	c.lo, c.hi = a[0], a[1]
	return err
}

func TestAddJobRefusesTypesThatJSONCannotCarry(t *testing.T) {
	t.Parallel()
	split := func(_ context.Context, _ sumArgs, emit func(hiddenSpan) error) error {
		return emit(hiddenSpan{lo: 0, hi: 10})
	}
	err := mapreduce.AddJob(mapreduce.NewJobs(), mapreduce.Job[sumArgs, hiddenSpan, int, int]{Name: "hidden", Split: split,
		Map: func(context.Context, hiddenSpan) (int, error) { return 0, nil }})
	if err == nil || !strings.Contains(err.Error(), "page type mapreduce_test.hiddenSpan has no exported fields") || !strings.Contains(err.Error(), "export its fields") {
		t.Errorf("a page type with no exported fields: %v; want it named, with the fix", err)
	}
	err = mapreduce.AddJob(mapreduce.NewJobs(), mapreduce.Job[sumArgs, span, shape, int]{Name: "shapes",
		Split: func(context.Context, sumArgs, func(span) error) error { return nil },
		Map:   func(context.Context, span) (shape, error) { return nil, nil }})
	if err == nil || !strings.Contains(err.Error(), "result type mapreduce_test.shape is an interface type") {
		t.Errorf("an interface result type: %v; want it named", err)
	}
	// big.Int by value encodes as {}: its MarshalJSON has a pointer
	// receiver; *big.Int is fine.
	err = mapreduce.AddJob(mapreduce.NewJobs(), mapreduce.Job[sumArgs, span, big.Int, *big.Int]{Name: "bigs",
		Split: func(context.Context, sumArgs, func(span) error) error { return nil },
		Map:   func(context.Context, span) (big.Int, error) { return big.Int{}, nil }})
	if err == nil || !strings.Contains(err.Error(), "result type big.Int marshals itself only through a pointer") || !strings.Contains(err.Error(), "use *big.Int") {
		t.Errorf("a result type whose MarshalJSON has a pointer receiver: %v; want it named, with the fix", err)
	}
	// Fine: a type with its own MarshalJSON, no arguments at all, an
	// embedded struct's promoted fields, any.
	if err := mapreduce.AddJob(mapreduce.NewJobs(), mapreduce.Job[struct{}, customSpan, any, *embeddedArg]{Name: "fine",
		Split: func(context.Context, struct{}, func(customSpan) error) error { return nil },
		Map:   func(context.Context, customSpan) (any, error) { return nil, nil }}); err != nil {
		t.Errorf("types JSON carries: %v", err)
	}
	// With a Codec of one's own, the types are the codec's business.
	if err := mapreduce.AddJob(mapreduce.NewJobs(), mapreduce.Job[sumArgs, hiddenSpan, int, int]{Name: "gob", Split: split,
		Map:     func(context.Context, hiddenSpan) (int, error) { return 0, nil },
		Options: mapreduce.JobOptions{Codec: gobLike{}}}); err != nil {
		t.Errorf("a page type for a codec of one's own: %v", err)
	}
}

// gobLike is a Codec that is not JSON, for telling the check apart.
type gobLike struct{}

func (gobLike) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (gobLike) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
