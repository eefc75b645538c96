package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
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

// A run started again under the same Key after the first one expired is a
// new run: asynq still keeps the first one's archived and completed tasks,
// and none of their IDs or errors may leak into it.
func TestAKeyReusedAfterItsRunExpiredStartsAFreshRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var broken atomic.Bool
	broken.Store(true)
	j := sumJob("daily", newCounts(), e.opts(mapreduce.JobOptions{Retention: time.Second, MapRetries: -1}))
	j.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == 5 && broken.Load() {
			return 0, errors.New("the first run's failure")
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c := e.client()
	e.worker(c, 4)
	key := mapreduce.StartOptions{Key: "2026-11-21"}
	id := mustStart(t, c, "daily", sumArgs{N: 20, PageSize: 5}, key)
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateFailed {
		t.Fatalf("first run: %s, want failed", st.State)
	}
	testenv.WaitFor(t, 10*time.Second, "the first run to expire", func() bool {
		_, err := c.Status(context.Background(), id)
		return errors.Is(err, mapreduce.ErrRunNotFound)
	})
	broken.Store(false)
	if again := mustStart(t, c, "daily", sumArgs{N: 20, PageSize: 5}, key); again != id {
		t.Fatalf("run ID %s, want %s again", again, id)
	}
	st := wait(t, c, id, 10*time.Second)
	if st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 20*19/2 {
		t.Fatalf("second run: %s (%q), want succeeded with %d", st.State, st.Error, 20*19/2)
	}
}

// A Map that overruns MapTimeout fails on its last attempt with its own
// error, recorded although asynq archives the task at the deadline without
// waiting for the handler.
func TestAMapPastItsTimeoutIsRecordedAsFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := sumJob("slow", newCounts(), e.opts(mapreduce.JobOptions{MapTimeout: time.Second, MapRetries: -1}))
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	j.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == 5 {
			select {
			case <-time.After(10 * time.Second):
			case <-ctx.Done():
				// Return only once asynq, at the deadline, archived the
				// task without waiting for this handler.
				id, _ := asynq.GetTaskID(ctx)
				testenv.Eventually(5*time.Second, func() bool {
					ti, err := insp.GetTaskInfo(e.queue, id)
					return err == nil && ti.State == asynq.TaskStateArchived
				})
				return 0, ctx.Err()
			}
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "slow", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	st := wait(t, c, id, 10*time.Second)
	if st.State != mapreduce.StateFailed || st.Failed != 1 || !strings.Contains(st.Error, "page 1:") || !strings.Contains(st.Error, "deadline exceeded") {
		t.Fatalf("state %s, failed %d, error %q; want failed naming page 1's deadline", st.State, st.Failed, st.Error)
	}
}

// A mapping run that stops making progress has its unrecorded pages
// inspected: a page whose task asynq archived, or whose task vanished, is
// recorded as failed, and the run goes on to its reduce.
func TestReconcilerRecordsPagesWhoseTasksWereArchivedOrLost(t *testing.T) {
	t.Parallel()
	// Four tasks: the first archived, the second deleted, the third still
	// pending when the reconciler looks (it records itself), the fourth
	// done; each of one page, or of four (packing).
	for _, perTask := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d pages a task", perTask), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			cnt := newCounts()
			e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", cnt, e.opts(mapreduce.JobOptions{Semantics: mapreduce.CompleteSemantics}))))
			c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, StuckAfter: 100 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			insp := asynq.NewInspectorFromRedisClient(e.rdb)
			pages, typ, kind := 4*perTask, mapreduce.TypeMap, ":map:"
			var id string
			if perTask == 1 {
				id = mustStart(t, c, "sum", sumArgs{N: pages, PageSize: 1}, mapreduce.StartOptions{})
				if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
					t.Fatal(err)
				}
			} else {
				id = packedRun(t, e, c, "sum", pages, perTask)
				typ, kind = mapreduce.TypePages, ":pages:"
			}
			for _, ti := range e.pendingTasks(typ) {
				var err error
				switch {
				case strings.HasSuffix(ti.ID, kind+"0"):
					err = insp.ArchiveTask(e.queue, ti.ID) // its retries ran out while workers crashed
				case strings.HasSuffix(ti.ID, kind+strconv.Itoa(perTask)):
					err = insp.DeleteTask(e.queue, ti.ID) // deleted by hand
				case strings.HasSuffix(ti.ID, kind+strconv.Itoa(2*perTask)):
					// still pending when the reconciler looks
				default:
					if err = c.ProcessTask(ctx, task(ti)); err == nil {
						err = insp.DeleteTask(e.queue, ti.ID)
					}
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if rep, err := c.Reconcile(ctx); err != nil || rep.PagesFailed != 0 {
				t.Fatalf("a run that is not stuck yet: %+v, %v; want no repairs", rep, err)
			}
			// Once the run has recorded nothing for StuckAfter, a pass
			// repairs it.
			var rep mapreduce.Repairs
			testenv.WaitFor(t, 10*time.Second, "a pass to find the run stuck", func() bool {
				rep, err = c.Reconcile(ctx)
				return err != nil || rep.PagesFailed != 0
			})
			if err != nil || rep.PagesFailed != 2*perTask {
				t.Fatalf("repairs %+v, %v; want the %d pages of the archived and the lost task failed", rep, err, 2*perTask)
			}
			e.worker(c, 2)
			st := wait(t, c, id, 10*time.Second)
			if st.State != mapreduce.StateSucceeded || st.Done != 2*perTask || st.Failed != 2*perTask {
				t.Fatalf("state %s, done %d, failed %d (%s); want succeeded with %d done, %[5]d failed", st.State, st.Done, st.Failed, st.Error, 2*perTask)
			}
			cnt.mu.Lock()
			defer cnt.mu.Unlock()
			for _, pr := range cnt.reduced {
				switch {
				case pr.Index < perTask && (pr.Err == nil || !strings.Contains(pr.Err.Error(), "archived") || pr.Page.Lo != pr.Index):
					t.Errorf("page %d: %v, page %+v; want the archived task's error and the page's descriptor", pr.Index, pr.Err, pr.Page)
				case pr.Index >= perTask && pr.Index < 2*perTask && (pr.Err == nil || !strings.Contains(pr.Err.Error(), "disappeared")):
					t.Errorf("page %d: %v, want the lost task's error", pr.Index, pr.Err)
				case pr.Index >= 2*perTask && (pr.Err != nil || pr.Result != pr.Index):
					t.Errorf("page %d: result %d, error %v; want %[1]d", pr.Index, pr.Result, pr.Err)
				}
			}
		})
	}
}

// Keys may contain ':', so one run's ID can be another's plus a suffix:
// their Redis keys must still be apart.
func TestRunIDsThatExtendEachOtherDoNotShareKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c := e.client()
	e.worker(c, 4)
	var ids []string
	for _, key := range []string{"k", "k:results", "k:recorded", "k:failures"} {
		ids = append(ids, mustStart(t, c, "sum", sumArgs{N: 30, PageSize: 5}, mapreduce.StartOptions{Key: key}))
	}
	for _, id := range ids {
		st := wait(t, c, id, 30*time.Second)
		if st.State != mapreduce.StateSucceeded || st.Done != 6 || resultOf(t, c, st) != 30*29/2 {
			t.Errorf("run %s: %s, done %d (%s); want succeeded with 6 pages and %d", id, st.State, st.Done, st.Error, 30*29/2)
		}
	}
}

// Tasks of an earlier run under the same ID — still queued when it was
// cancelled, and run after the ID was used again — do nothing to the new
// run.
func TestTasksOfAnEarlierRunUnderTheSameIDDoNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("daily", newCounts(), e.opts(mapreduce.JobOptions{Retention: time.Second}))))
	c := e.client()
	ctx := context.Background()
	key := mapreduce.StartOptions{Key: "2026-11-21"}
	id := mustStart(t, c, "daily", sumArgs{N: 40, PageSize: 10}, key)
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, id); err != nil { // its four map tasks stay queued
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the first run to expire", func() bool {
		_, err := c.Status(ctx, id)
		return errors.Is(err, mapreduce.ErrRunNotFound)
	})
	// The same page indices, other pages: an old task recorded into the new
	// run would change its sum.
	mustStart(t, c, "daily", sumArgs{N: 60, PageSize: 15}, key)
	e.worker(c, 4) // runs the old map tasks, queued first, and the new run's
	st := wait(t, c, id, 10*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 4 || resultOf(t, c, st) != 60*59/2 {
		t.Fatalf("second run: %s, done %d (%s); want succeeded over its own 4 pages, %d", st.State, st.Done, st.Error, 60*59/2)
	}
}

// A Split that emits fewer pages on retry than pages already recorded
// fails the run with a message that says why, rather than reducing over
// counts that cannot be trusted.
func TestASplitThatChangesItsPagesOnRetryFailsTheRunClearly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client()
	var attempts atomic.Int32
	j := sumJob("shifty", newCounts(), e.opts(mapreduce.JobOptions{StepRetries: 1}))
	j.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		n := 6
		if attempts.Add(1) > 1 {
			n = 4
		}
		for i := range n {
			if err := emit(span{i, i + 1}); err != nil {
				return err
			}
		}
		if n == 6 { // fail once every page is recorded, to be retried
			id, _ := mapreduce.RunID(ctx)
			var stErr error
			if !testenv.Eventually(10*time.Second, func() bool {
				st, err := c.Status(ctx, id)
				stErr = err
				return err != nil || st.Done == 6
			}) {
				return errors.New("the 6 pages were not recorded within 10s")
			}
			if stErr != nil {
				return stErr
			}
			return errors.New("a transient split failure")
		}
		return nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	e.worker(c, 4)
	id := mustStart(t, c, "shifty", sumArgs{}, mapreduce.StartOptions{})
	st := wait(t, c, id, 10*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, "same pages in the same order") {
		t.Fatalf("state %s, error %q; want failed, saying Split must be deterministic", st.State, st.Error)
	}
	// Ended like any run: its keys expire, and the job may run again.
	keys, _ := e.rdb.Keys(context.Background(), e.prefix+":{shifty}:run:*").Result()
	if len(keys) != 1 || e.rdb.PTTL(context.Background(), keys[0]).Val() <= 0 {
		t.Errorf("the failed run's record %v has no expiry", keys)
	}
	if _, err := c.StartAny(context.Background(), "shifty", sumArgs{}, mapreduce.StartOptions{}); err != nil {
		t.Errorf("starting the job again: %v", err)
	}
}

func TestWaitReturnsAtOnceForAMalformedOrUnknownRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	for _, id := range []string{"bogus", "sum:never-started"} {
		done := make(chan error, 1)
		go func() { _, err := c.Wait(context.Background(), id); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("Wait(%q) succeeded", id)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Wait(%q) did not return", id)
		}
	}
}

// takeWithoutHandler moves pending task id to active as asynq v0.26's
// dequeue does (its key layout), with no handler to run it: what Redis
// does with a dequeue its worker gave up on, delivered when a network
// partition heals.
func (e *env) takeWithoutHandler(id string) {
	e.t.Helper()
	ctx := context.Background()
	q := "asynq:{" + e.queue + "}:"
	if n, err := e.rdb.LRem(ctx, q+"pending", 1, id).Result(); err != nil || n != 1 {
		e.t.Fatalf("task %s is not pending: %d, %v", id, n, err)
	}
	_, err := e.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, q+"active", id)
		p.HSet(ctx, q+"t:"+id, "state", "active")
		p.HDel(ctx, q+"t:"+id, "pending_since")
		p.ZAdd(ctx, q+"lease", redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: id})
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// A task asynq shows as active that no handler ever started (its dequeue
// ran after its worker had given up on the reply) gets its copy at the
// scan after the one that first saw it. One whose handler started, and
// which no live worker lists yet, waits out asynq's heartbeat first: its
// worker may still list it.
func TestATaskTakenButNeverStartedIsCopiedAtTheNextScan(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var c *mapreduce.Client
	// Which tasks' Map saw its handler's mark in Redis.
	var marked sync.Map
	j := sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))
	inner := j.Map
	j.Map = func(ctx context.Context, p span) (int, error) {
		id, _ := asynq.GetTaskID(ctx)
		n, _ := asynq.GetRetryCount(ctx)
		marked.Store(id, e.rdb.Exists(ctx, c.ClaimKey("sum", id, n)).Val() == 1)
		return inner(ctx, p)
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c = e.client()
	id := mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	maps := e.pendingTasks(mapreduce.TypeMap)
	if len(maps) != 4 {
		t.Fatalf("%d map tasks pending, want 4", len(maps))
	}
	lost, started := maps[0], maps[1]
	e.takeWithoutHandler(lost.ID)
	e.takeWithoutHandler(started.ID)
	if err := e.rdb.Set(ctx, c.ClaimKey("sum", started.ID, 0), "", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.ScanOrphans(ctx, "sum"); err != nil || n != 0 {
		t.Fatalf("the first scan enqueued %d copies (%v); it only notes what it saw", n, err)
	}
	e.ageSightings("sum", mapreduce.UnclaimedGrace+100*time.Millisecond)
	if n, err := c.ScanOrphans(ctx, "sum"); err != nil || n != 1 {
		t.Fatalf("the second scan, %v later, enqueued %d copies (%v); want 1, of the task no handler started", mapreduce.UnclaimedGrace, n, err)
	}
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	var copied []string
	for _, ti := range e.pendingTasks(mapreduce.TypeMap) {
		if base, _, ok := strings.Cut(ti.ID, "~"); ok {
			copied = append(copied, base)
		}
	}
	if len(copied) != 1 || copied[0] != lost.ID {
		t.Fatalf("copies of %v enqueued; want one of %s", copied, lost.ID)
	}
	// The claimed task gets its copy once asynq's heartbeat would have
	// listed it.
	if ti, err := insp.GetTaskInfo(e.queue, started.ID); err != nil || ti.State != asynq.TaskStateActive {
		t.Fatalf("the claimed task: %+v, %v; want it still active", ti, err)
	}
	e.ageSightings("sum", mapreduce.OrphanGrace-mapreduce.UnclaimedGrace)
	if n, err := c.ScanOrphans(ctx, "sum"); err != nil || n != 1 {
		t.Fatalf("a scan %v after the first enqueued %d copies (%v); want 1, of the claimed task", mapreduce.OrphanGrace, n, err)
	}

	// Real handlers mark their tasks before Map runs, and recording the
	// page takes the mark away.
	e.worker(c, 2)
	st := wait(t, c, id, 20*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 4 {
		t.Fatalf("state %s, done %d (%s); want succeeded with 4 pages", st.State, st.Done, st.Error)
	}
	for _, ti := range maps[2:] {
		if v, ok := marked.Load(ti.ID); !ok || !v.(bool) {
			t.Errorf("task %s: Map ran (%v) without its handler's mark in Redis", ti.ID, ok)
		}
		if n, _ := e.rdb.Exists(ctx, c.ClaimKey("sum", ti.ID, 0)).Result(); n != 0 {
			t.Errorf("task %s: its mark outlived the page's record", ti.ID)
		}
	}
}

// An orphan stays active in asynq long after its copy is enqueued: asynq's
// recoverer takes it back only once its lease has been expired for 30s.
// The scans meanwhile see it again and again; one copy must be all it
// gets. Each further copy of a page whose copy is still at work would run
// Map again (a second query of the same page), and each copy of a split
// would run Split's own work once more before finding the first copy
// feeding.
func TestAnOrphanStillActiveAfterItsCopyIsNotCopiedAgain(t *testing.T) {
	t.Parallel()
	e, c, id, lost := orphanedPage(t)
	copies := func() (n int) {
		for _, ti := range e.pendingTasks(mapreduce.TypeMap) {
			if base, _, ok := strings.Cut(ti.ID, "~"); ok && base == lost.ID {
				n++
			}
		}
		return n
	}
	// Five scans, each a grace apart: without a record of the copy, every
	// other one would enqueue another.
	if total := scanOrphans(t, e, c, 5); total != 1 || copies() != 1 {
		t.Fatalf("five scans of an orphan still active enqueued %d copies (%d pending); want 1", total, copies())
	}
	e.worker(c, 2)
	if st := wait(t, c, id, 20*time.Second); st.State != mapreduce.StateSucceeded || st.Done != 4 {
		t.Fatalf("state %s, done %d (%s); want succeeded with 4 pages", st.State, st.Done, st.Error)
	}
}

// A settled sighting names the attempt it settled: a later attempt of the
// same task, orphaned in turn (asynq retried the orphan, and that worker
// died too), is sighted afresh and copied.
func TestALaterAttemptOfASettledOrphanIsCopied(t *testing.T) {
	t.Parallel()
	e, c, _, lost := orphanedPage(t)
	// As a scan leaves the sighting of an earlier attempt it copied: one
	// that had failed once, at another time.
	if err := e.rdb.HSet(context.Background(), e.prefix+":{sum}:orphans", lost.ID, "settled#0#1700000000000").Err(); err != nil {
		t.Fatal(err)
	}
	if total := scanOrphans(t, e, c, 3); total != 1 {
		t.Fatalf("three scans of an orphaned attempt whose earlier attempt was settled enqueued %d copies; want 1", total)
	}
}

// orphanedPage starts a run of job "sum" (four pages), splits it, and
// makes its first page's task an orphan that no handler started.
func orphanedPage(t *testing.T) (e *env, c *mapreduce.Client, id string, lost *asynq.TaskInfo) {
	t.Helper()
	e = newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	c = e.client()
	id = mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	if err := c.ProcessTask(context.Background(), task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	lost = e.pendingTasks(mapreduce.TypeMap)[0]
	e.takeWithoutHandler(lost.ID)
	return e, c, id, lost
}

// scanOrphans runs n orphan scans of job "sum", each a grace after the
// one before, and returns how many copies they enqueued.
func scanOrphans(t *testing.T, e *env, c *mapreduce.Client, n int) (copies int) {
	t.Helper()
	for range n {
		k, err := c.ScanOrphans(context.Background(), "sum")
		if err != nil {
			t.Fatal(err)
		}
		copies += k
		e.ageSightings("sum", mapreduce.UnclaimedGrace+100*time.Millisecond)
	}
	return copies
}

// ageSightings moves the orphan scans' first sightings of job's tasks d
// into the past, as if d had passed since the scans that made them (a
// scan measures a task's time as an orphan from its first sighting).
// Settled sightings stay as they are.
func (e *env) ageSightings(job string, d time.Duration) {
	e.t.Helper()
	ctx := context.Background()
	key := e.prefix + ":{" + job + "}:orphans"
	seen, err := e.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	for id, v := range seen {
		first, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue // settled
		}
		if err := e.rdb.HSet(ctx, key, id, first-d.Milliseconds()).Err(); err != nil {
			e.t.Fatal(err)
		}
	}
}

// runReads is a go-redis hook that counts the run records read (HGETALL,
// or HMGET of their summary, of a key under prefix), in pipelines and
// alone.
type runReads struct {
	prefix string
	n      atomic.Int64
}

func (h *runReads) count(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		if a := cmd.Args(); (cmd.Name() == "hgetall" || cmd.Name() == "hmget") && len(a) >= 2 && strings.HasPrefix(fmt.Sprint(a[1]), h.prefix) {
			h.n.Add(1)
		}
	}
}

func (h *runReads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *runReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *runReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.count(cmds...); return next(ctx, cmds) }
}

// countingClient returns a client of e's registry on a Redis client of its
// own, which counts the run records it reads.
func (e *env) countingClient(job string) (*mapreduce.Client, *runReads) {
	e.t.Helper()
	h := &runReads{prefix: e.prefix + ":{" + job + "}:run:"}
	return e.hookedClient(h), h
}

// Every worker's reconciler passes over the unfinished runs of every job
// every 30 s, and a job run every minute and kept a day keeps 1,440 runs:
// a pass reads the job's index of unfinished runs, not every run kept.
func TestAReconcilePassReadsTheUnfinishedRunsNotEveryRunKept(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c := e.client()
	const ended = 30
	for range ended {
		id := mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
		if err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	live := mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	loseSplit := func() {
		t.Helper()
		if err := insp.DeleteTask(e.queue, e.taskOf(mapreduce.TypeSplit, live).ID); err != nil {
			t.Fatal(err)
		}
	}
	loseSplit()
	rc, reads := e.countingClient("sum")
	rep, err := rc.Reconcile(ctx)
	if err != nil || rep.SplitsEnqueued != 1 {
		t.Fatalf("the first pass: %+v, %v; want the lost split enqueued", rep, err)
	}
	if n := reads.n.Load(); n != 1 {
		t.Fatalf("the pass read %d runs; want 1, the one unfinished of the %d kept", n, ended+1)
	}
}

// The index of unfinished runs mends itself: a pass takes out an entry
// whose run has ended or whose record is gone (deleted by hand, evicted),
// and Retry lists a run again.
func TestTheIndexOfUnfinishedRunsDropsRunsEndedOrGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c := e.client()
	index := e.prefix + ":{sum}:unfinished"
	listed := func(id string) bool {
		t.Helper()
		_, err := e.rdb.ZScore(ctx, index, id).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}
	ended := mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	if !listed(ended) {
		t.Fatal("Start did not list its run as unfinished")
	}
	if err := c.Cancel(ctx, ended); err != nil {
		t.Fatal(err)
	}
	if listed(ended) {
		t.Fatal("Cancel left its run listed as unfinished")
	}
	e.rdb.ZAdd(ctx, index, redis.Z{Score: 1, Member: ended})      // listed, though ended
	e.rdb.ZAdd(ctx, index, redis.Z{Score: 1, Member: "sum:gone"}) // a record evicted or deleted by hand
	if _, err := e.client().Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if listed(ended) || listed("sum:gone") {
		t.Fatalf("listed as unfinished after a pass: the ended run %v, the gone one %v; want neither", listed(ended), listed("sum:gone"))
	}
	if err := c.Retry(ctx, ended); err != nil {
		t.Fatal(err)
	}
	if !listed(ended) {
		t.Fatal("Retry did not list its run as unfinished again")
	}
}

// A pass unlists the runs it read as ended; unlist.lua checks each again,
// so that a run Retry resumed after the pass read it stays listed.
func TestUnlistKeepsARunResumedSinceItWasReadAsEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c := e.client()
	resumed := mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	ended := mustStart(t, c, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	for _, id := range []string{resumed, ended} {
		if err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Retry(ctx, resumed); err != nil {
		t.Fatal(err)
	}
	index := e.prefix + ":{sum}:unfinished"
	e.rdb.ZAdd(ctx, index, redis.Z{Score: 1, Member: ended}) // listed, though ended
	n, err := c.Unlist(ctx, "sum", resumed, ended)
	if err != nil || n != 1 {
		t.Fatalf("unlist took out %d runs (%v); want 1, the ended one", n, err)
	}
	if ids := e.rdb.ZRange(ctx, index, 0, -1).Val(); len(ids) != 1 || ids[0] != resumed {
		t.Fatalf("the index lists %v; want only the resumed run %s", ids, resumed)
	}
}
