package mapreduce_test

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
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

// table is a keyset source that changes while a run splits it: sorted
// keys, each read and changed under a lock.
type table struct {
	mu   sync.Mutex
	keys []int
}

// newTable holds the keys 0, 10, 20, … of n rows.
func newTable(n int) *table {
	tb := &table{}
	for i := range n {
		tb.keys = append(tb.keys, 10*i)
	}
	return tb
}

// in returns the keys k with lo < k <= hi.
func (tb *table) in(lo, hi int) []int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []int
	for _, k := range tb.keys {
		if k > lo && k <= hi {
			out = append(out, k)
		}
	}
	return out
}

func (tb *table) delete(keys ...int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.keys = slices.DeleteFunc(tb.keys, func(k int) bool { return slices.Contains(keys, k) })
}

func (tb *table) insert(keys ...int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.keys = append(tb.keys, keys...)
	slices.Sort(tb.keys)
}

type keyRange struct{ Lo, Hi int }

// keysetSplit is a run over a table that changes between its split's
// first attempt and the next: when the split starts again, the first page's
// keys are deleted (so pages counted by position shift by one) and keys
// are inserted between and after the others.
type keysetSplit struct {
	tb     *table
	splits atomic.Int32
	mu     sync.Mutex
	seen   map[int]int // key → times a Map read it
}

func newKeysetSplit(rows int) *keysetSplit {
	s := &keysetSplit{tb: newTable(rows), seen: map[int]int{}}
	return s
}

// job returns the job; Split resumes from its cursor if resume is set.
func (s *keysetSplit) job(name string, resume bool, o mapreduce.JobOptions) mapreduce.Job[int, keyRange, int, int] {
	const pageSize = 2
	return mapreduce.Job[int, keyRange, int, int]{
		Name: name,
		Split: func(ctx context.Context, _ int, emit func(keyRange) error) error {
			if s.splits.Add(1) == 2 {
				first := s.tb.in(-1, 10)
				s.tb.delete(first...)
				var added []int
				for k := 5; k < 20_000; k += 40 {
					added = append(added, k)
				}
				s.tb.insert(added...)
				s.tb.insert(1_000_000, 1_000_010)
			}
			lo := -1
			if resume {
				if c, ok := mapreduce.ResumeSplit(ctx); ok {
					v, err := strconv.Atoi(c)
					if err != nil {
						return err
					}
					lo = v
				}
			}
			keys := s.tb.in(lo, 1<<62)
			for j := 0; j < len(keys); j += pageSize {
				hi := keys[min(j+pageSize, len(keys))-1]
				mapreduce.SetSplitCursor(ctx, strconv.Itoa(hi))
				if err := emit(keyRange{lo, hi}); err != nil {
					return err
				}
				lo = hi
			}
			return nil
		},
		Map: func(ctx context.Context, r keyRange) (int, error) {
			time.Sleep(5 * time.Millisecond) // a page's work: the run outlasts half a 1 s SplitTimeout
			keys := s.tb.in(r.Lo, r.Hi)
			s.mu.Lock()
			for _, k := range keys {
				s.seen[k]++
			}
			s.mu.Unlock()
			return len(keys), nil
		},
		Options: o,
	}
}

// check counts the keys a Map read more than once, and the keys present
// throughout the run (those of start still in the table) that no Map read.
func (s *keysetSplit) check(start []int) (twice, missed []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.tb.in(-1, 1<<62)
	for k, n := range s.seen {
		if n > 1 {
			twice = append(twice, k)
		}
	}
	for _, k := range start {
		if slices.Contains(end, k) && s.seen[k] == 0 {
			missed = append(missed, k)
		}
	}
	slices.Sort(twice)
	return twice, missed
}

// wantEachKeyOnce fails t if check finds a key read twice or missed.
func (s *keysetSplit) wantEachKeyOnce(t *testing.T, start []int) {
	t.Helper()
	if twice, missed := s.check(start); len(twice)+len(missed) > 0 {
		t.Errorf("keys read twice: %v; keys present throughout the run not read: %v", twice, missed)
	}
}

// run starts job, runs it on a worker of c, and fails t unless the run
// succeeds with Split called more than once.
func (s *keysetSplit) run(t *testing.T, e *env, c *mapreduce.Client, job mapreduce.Job[int, keyRange, int, int]) {
	t.Helper()
	id, err := job.Start(context.Background(), c, 0, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.finish(t, e, c, id)
}

// finish runs a started run on a worker of c, and fails t unless it
// succeeds with Split called more than once.
func (s *keysetSplit) finish(t *testing.T, e *env, c *mapreduce.Client, id string) {
	t.Helper()
	e.worker(c, 4)
	if st := wait(t, c, id, time.Minute); st.State != mapreduce.StateSucceeded {
		t.Fatalf("run ended %s: %s", st.State, st.Error)
	}
	if n := s.splits.Load(); n < 2 {
		t.Fatalf("Split ran %d times: the split never started again, so this test proves nothing", n)
	}
}

func TestASplitHandedOnOverAChangedTableResumesFromItsCursor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		resume bool
	}{
		{"from its cursor", true},
		{"by position", false}, // the control: shows the change would break a join
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			s := newKeysetSplit(1200)
			start := s.tb.in(-1, 1<<62)
			// 600 pages of 5 ms over 4 slots: ~0.75s, past half the split's 1s timeout.
			job := s.job("keyset", tc.resume, e.opts(mapreduce.JobOptions{Window: 50, SplitTimeout: time.Second}))
			e.addJob(mapreduce.AddJob(e.jobs, job))
			c := e.client()
			s.run(t, e, c, job)
			twice, missed := s.check(start)
			switch {
			case tc.resume && len(twice)+len(missed) > 0:
				t.Errorf("keys read twice: %v; keys present throughout the run not read: %v", twice, missed)
			case !tc.resume && len(twice)+len(missed) == 0:
				t.Error("a split resumed by position over the changed table read every key once: the change does not move the pages, so the test above proves nothing")
			}
		})
	}
}

func TestASplitWhoseWorkerDiesBetweenFeedingAndEnqueuingLosesNoPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newKeysetSplit(1200)
	start := s.tb.in(-1, 1<<62)
	job := s.job("dies", true, e.opts(mapreduce.JobOptions{Window: 50}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	// The first attempt stores a feed of pages in the run, enqueues some of
	// them, and fails (as if killed) on page 300's enqueue: the next attempt
	// must enqueue the rest of that feed from what the run stored, and go on
	// after it.
	var failed atomic.Bool
	c.SetEnqueueFault(func(page int) error {
		if page == 300 && failed.CompareAndSwap(false, true) {
			return errors.New("the worker died")
		}
		return nil
	})
	s.run(t, e, c, job)
	if !failed.Load() {
		t.Fatal("the enqueue fault never fired, so this test proves nothing")
	}
	s.wantEachKeyOnce(t, start)
}

// A copy of a split task runs while the original still does (the
// reconciler copies a task whose worker seems dead), and the table changes
// between their Splits: the two cut different pages. The one that finds
// the other feeding ends, so that no page index is fed twice with
// different pages.
func TestTwoAttemptsOfASplitAtOnceFeedOnePagingOfTheTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newKeysetSplit(1200)
	start := s.tb.in(-1, 1<<62)
	job := s.job("twice", true, e.opts(mapreduce.JobOptions{Window: 50}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	id, err := job.Start(ctx, c, 0, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	split := task(e.taskOf("batchmr:split", id))
	copied := make(chan error, 1)
	go func() { copied <- c.ProcessTask(ctx, split) }()
	s.finish(t, e, c, id) // the worker runs the original
	if err := <-copied; err != nil {
		t.Errorf("the copy of the split task: %v", err)
	}
	s.wantEachKeyOnce(t, start)
}

// A run whose split was feeding when its stored feed was lost (deleted,
// and its first fill's tasks with it): the next split runs Split from the
// start, enqueues again the pages in [resume, fed) as they are emitted,
// without waiting for room (the window counts them), and keeps the window.
func TestARunWhoseStoredFeedIsLostFinishesWithinItsWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages, window = 400, 50
	var maps mapCalls
	job := mapreduce.Job[int, int, int, int]{
		Name:  "upgraded",
		Split: emitPages,
		Map: func(ctx context.Context, i int) (int, error) {
			time.Sleep(time.Millisecond) // a page's work: the split outruns the Maps and fills the window
			maps.add(i)
			return i, nil
		},
		Options: e.opts(mapreduce.JobOptions{Window: window}),
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	id, err := job.Start(ctx, c, pages, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A first attempt, with no worker to run pages, feeds the first fill and
	// waits for room; it is stopped there, and the run left with no
	// stored feed, resume 0, fed 50, and the first fill's tasks lost.
	k := e.prefix + ":{upgraded}:run:" + id
	first, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.ProcessTask(first, task(e.taskOf("batchmr:split", id)))
	}()
	testenv.WaitFor(t, 10*time.Second, "the first fill", func() bool {
		fed, _ := e.rdb.HGet(ctx, k, "fed").Int()
		return fed == window
	})
	stop()
	<-done
	if err := e.rdb.HDel(ctx, k, "feeding", "cursor").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, k, "resume", 0).Err(); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	for _, ti := range e.pendingTasks("batchmr:map") {
		if err := insp.DeleteTask(e.queue, ti.ID); err != nil {
			t.Fatal(err)
		}
	}
	const concurrency = 4
	e.worker(c, concurrency) // runs the split task, still pending, and the pages
	peak := 0
	sampleUntilEnded(t, c, id, pages, 2*time.Millisecond, func(*mapreduce.Status) {
		peak = max(peak, queueTasks(t, e.rdb, e.queue))
	})
	// A page leaves the window when it is recorded, just before asynq drops
	// its task: each handler may hold one such task beyond it.
	if peak > window+1+concurrency {
		t.Errorf("asynq held up to %d tasks of a run whose window is %d pages (plus its split, and %d tasks handlers are finishing)", peak, window, concurrency)
	}
	maps.wantEachOnce(t, pages)
}

// The copy of a split task that a live original is still running feeds
// first; the original, finding it ahead, stops, and asynq marks it
// completed. The copy is then the run's split task: the reconciler, which
// hands a splitting run on when its split task completed, must not start
// a third attempt (each would run Split's own work again, and stop).
func TestACopyThatFeedsAheadOfItsOriginalIsTheSplitTheReconcilerWatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages = 600
	var (
		maps      mapCalls
		splits    atomic.Int32
		mapped    = make(chan struct{})
		firstPage sync.Once
	)
	job := mapreduce.Job[int, int, int, int]{
		Name: "copied",
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			splits.Add(1)
			if id, _ := asynq.GetTaskID(ctx); !strings.HasSuffix(id, "~copy") {
				// The original, cut off until the copy has fed pages.
				select {
				case <-mapped:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return emitPages(ctx, n, emit)
		},
		Map: func(ctx context.Context, i int) (int, error) {
			firstPage.Do(func() { close(mapped) })
			time.Sleep(2 * time.Millisecond) // a page's work: the copy feeds across many reconciler passes
			maps.add(i)
			return i, nil
		},
		Options: e.opts(mapreduce.JobOptions{Window: 50}),
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	id, err := job.Start(ctx, c, pages, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig := e.taskOf("batchmr:split", id) // copied as the orphan scan does (orphans.go)
	if _, err := asynq.NewClientFromRedisClient(e.rdb).Enqueue(asynq.NewTask(orig.Type, orig.Payload),
		asynq.TaskID(orig.ID+"~copy"), asynq.Queue(e.queue), asynq.MaxRetry(orig.MaxRetry), asynq.Retention(time.Hour)); err != nil {
		t.Fatal(err)
	}
	e.worker(c, 4)
	handOns := 0
	sampleUntilEnded(t, c, id, pages, 20*time.Millisecond, func(*mapreduce.Status) {
		rep, err := c.Reconcile(ctx)
		if err != nil {
			t.Error(err)
		}
		handOns += rep.SplitsEnqueued
	})
	if n := splits.Load(); n != 2 {
		t.Errorf("Split ran %d times, want 2 (the original and its copy)", n)
	}
	if handOns > 0 {
		t.Errorf("the reconciler handed the split on %d times while the copy was feeding", handOns)
	}
	maps.wantEachOnce(t, pages)
}

// lostReply is a go-redis hook that, once, lets the nth pipeline that
// moves a split's window (feed.lua with all its arguments) run in Redis
// and then fails it as a network timeout would: Redis applied the feed,
// and the feeder does not know.
type lostReply struct {
	n, seen int
	fired   atomic.Bool
}

func (h *lostReply) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if mapreduce.IsFeedMove(cmd.Args()) {
				h.seen++
				if h.seen == h.n && h.fired.CompareAndSwap(false, true) {
					lost := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
					cmd.SetErr(lost)
					return lost
				}
			}
		}
		return err
	}
}

// The reply to a feed is lost after Redis applied it, and the feeder sends
// it again: the run's fed mark has moved past where the feed starts, as if
// another attempt were feeding, but the feed is the attempt's own, and the
// split goes on.
func TestAFeedSentAgainAfterItsReplyWasLostIsTheSplitsOwn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newKeysetSplit(1200)
	start := s.tb.in(-1, 1<<62)
	job := s.job("lost", true, e.opts(mapreduce.JobOptions{Window: 50}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	hook := &lostReply{n: 3}
	c := e.hookedClient(hook)
	e.worker(c, 4)
	id, err := job.Start(context.Background(), c, 0, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded {
		t.Fatalf("run ended %s: %s", st.State, st.Error)
	}
	if !hook.fired.Load() {
		t.Fatal("no feed's reply was lost, so this test proves nothing")
	}
	s.wantEachKeyOnce(t, start)
}
