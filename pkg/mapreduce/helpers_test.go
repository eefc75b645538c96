package mapreduce_test

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// env is one test's world: a real Redis, a key prefix and an asynq queue
// that no other test uses, and a job registry.
type env struct {
	t      *testing.T
	rdb    *redis.Client
	prefix string
	queue  string
	jobs   *mapreduce.Jobs
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return &env{t: t, rdb: rdb, prefix: prefix, queue: testenv.Queue(t, rdb, prefix), jobs: mapreduce.NewJobs()}
}

// deleteQueue removes an asynq queue's keys from one node (testenv.Queue
// does it for a test's own standalone Redis).
func deleteQueue(rdb *redis.Client, queue string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, "asynq:{"+queue+"}:*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	rdb.SRem(ctx, "asynq:queues", queue)
}

// client returns a mapreduce client of the env's registry.
func (e *env) client() *mapreduce.Client {
	e.t.Helper()
	return e.clientOn(e.rdb)
}

// hookedClient returns a mapreduce client of the env's registry on a Redis
// client of its own, with hook added; the client closes when the test
// ends.
func (e *env) hookedClient(hook redis.Hook) *mapreduce.Client {
	e.t.Helper()
	rdb := redis.NewClient(e.rdb.Options())
	rdb.AddHook(hook)
	e.t.Cleanup(func() { rdb.Close() })
	return e.clientOn(rdb)
}

func (e *env) clientOn(rdb *redis.Client) *mapreduce.Client {
	e.t.Helper()
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, CancelPoll: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// loggedClient returns a client of the env's registry that logs, from
// level up, as JSON to the buffer it returns.
func (e *env) loggedClient(level slog.Level) (*mapreduce.Client, *testenv.LogBuffer) {
	e.t.Helper()
	logs := &testenv.LogBuffer{}
	c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		e.t.Fatal(err)
	}
	return c, logs
}

// worker starts an asynq server on the env's queue that runs c's tasks,
// with short intervals so that tests run fast; it stops when the test ends.
func (e *env) worker(c *mapreduce.Client, concurrency int) *asynq.Server {
	e.t.Helper()
	return e.workerPolling(c, concurrency, 10*time.Millisecond)
}

// workerPolling is worker with poll for asynq's TaskCheckInterval: how
// long a handler slot that found the queue empty sleeps before it looks
// again (asynq's default is a second, the worker command's 100 ms).
func (e *env) workerPolling(c *mapreduce.Client, concurrency int, poll time.Duration) *asynq.Server {
	e.t.Helper()
	return e.serve(c, asynq.Config{
		Concurrency:              concurrency,
		Queues:                   map[string]int{e.queue: 1},
		TaskCheckInterval:        poll,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		ShutdownTimeout:          5 * time.Second,
		LogLevel:                 asynq.FatalLevel,
	}, nil)
}

// serve starts an asynq server on cfg, as c.ServerConfig completes it,
// that runs c's tasks, and more's handlers if given; it stops when the
// test ends.
func (e *env) serve(c *mapreduce.Client, cfg asynq.Config, more func(*asynq.ServeMux)) *asynq.Server {
	e.t.Helper()
	cfg, err := c.ServerConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(e.rdb, cfg)
	mux := asynq.NewServeMux()
	c.Register(mux)
	if more != nil {
		more(mux)
	}
	if err := srv.Start(mux); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(srv.Shutdown)
	return srv
}

// opts puts a job in the env's queue, with quick retries unless the test
// sets its own Backoff.
func (e *env) opts(o mapreduce.JobOptions) mapreduce.JobOptions {
	o.Queue = e.queue
	if o.Backoff == nil {
		o.Backoff = func(int, error) time.Duration { return 10 * time.Millisecond }
	}
	return o
}

func (e *env) addJob(err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}

// wait waits for a run to end, failing the test after timeout.
func wait(t *testing.T, c *mapreduce.Client, id string, timeout time.Duration) *mapreduce.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := c.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// --- the sum job: the test workload -----------------------------------------

// emitPages is a Split that emits the pages 0 to n-1.
func emitPages(_ context.Context, n int, emit func(int) error) error {
	for i := range n {
		if err := emit(i); err != nil {
			return err
		}
	}
	return nil
}

// sampleUntilEnded calls sample with run id's status every interval until
// the run ends, and fails t unless it succeeds within a minute with every
// one of pages done.
func sampleUntilEnded(t *testing.T, c *mapreduce.Client, id string, pages int, every time.Duration, sample func(*mapreduce.Status)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := c.Status(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		sample(st)
		if st.State.Ended() {
			if st.State != mapreduce.StateSucceeded || st.Done != pages {
				t.Fatalf("run ended %s with %d of %d pages done: %s", st.State, st.Done, pages, st.Error)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not end within a minute: %s, %d of %d pages done", st.State, st.Done, pages)
		}
		time.Sleep(every)
	}
}

// sumArgs asks for the sum of 0..N-1 in pages of PageSize numbers.
type sumArgs struct {
	N, PageSize int
}

// span is a page: the numbers [Lo, Hi).
type span struct {
	Lo, Hi int
}

// counts records what a job's functions saw, for the assertions.
type counts struct {
	mu       sync.Mutex
	maps     map[int]int // page Lo -> Map calls
	reduces  int
	reduced  []mapreduce.PageResult[span, int]
	mapCalls int
}

func newCounts() *counts { return &counts{maps: map[int]int{}} }

func (c *counts) mapped(lo int) {
	c.mu.Lock()
	c.maps[lo]++
	c.mapCalls++
	c.mu.Unlock()
}

func (c *counts) snapshot() (mapCalls, reduces int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mapCalls, c.reduces
}

func splitSpans(_ context.Context, a sumArgs, emit func(span) error) error {
	for lo := 0; lo < a.N; lo += a.PageSize {
		if err := emit(span{lo, min(lo+a.PageSize, a.N)}); err != nil {
			return err
		}
	}
	return nil
}

func sumSpan(p span) int {
	s := 0
	for i := p.Lo; i < p.Hi; i++ {
		s += i
	}
	return s
}

// sumJob is a complete job: its Map sums a span, its Reduce the sums.
// gateMap makes job's Map wait, before each page, until gate is closed.
func gateMap(job *mapreduce.Job[sumArgs, span, int, int], gate <-chan struct{}) {
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		<-gate
		return inner(ctx, p)
	}
}

func sumJob(name string, c *counts, o mapreduce.JobOptions) mapreduce.Job[sumArgs, span, int, int] {
	return mapreduce.Job[sumArgs, span, int, int]{
		Name:  name,
		Split: splitSpans,
		Map: func(ctx context.Context, p span) (int, error) {
			c.mapped(p.Lo)
			return sumSpan(p), nil
		},
		Reduce: func(ctx context.Context, a sumArgs, pages iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
			c.mu.Lock()
			c.reduces++
			c.reduced = nil
			c.mu.Unlock()
			total := 0
			for pr, err := range pages {
				if err != nil {
					return 0, err
				}
				c.mu.Lock()
				c.reduced = append(c.reduced, pr)
				c.mu.Unlock()
				if pr.Err == nil {
					total += pr.Result
				}
			}
			return total, nil
		},
		Options: o,
	}
}

func resultOf(t *testing.T, c *mapreduce.Client, st *mapreduce.Status) int {
	t.Helper()
	n, err := sumJob(st.Job, nil, mapreduce.JobOptions{}).Result(st)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustStart(t *testing.T, c *mapreduce.Client, job string, args any, opts mapreduce.StartOptions) string {
	t.Helper()
	id, err := c.StartAny(context.Background(), job, args, opts)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// pendingTasks returns the tasks waiting in the env's queue, of one type.
func (e *env) pendingTasks(typ string) []*asynq.TaskInfo {
	e.t.Helper()
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	var out []*asynq.TaskInfo
	for page := 1; ; page++ {
		infos, err := insp.ListPendingTasks(e.queue, asynq.Page(page), asynq.PageSize(1000))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			e.t.Fatal(err)
		}
		for _, ti := range infos {
			if ti.Type == typ {
				out = append(out, ti)
			}
		}
		if len(infos) < 1000 {
			return out
		}
	}
}

func task(ti *asynq.TaskInfo) *asynq.Task { return asynq.NewTask(ti.Type, ti.Payload) }

// taskOf returns the one pending task of a type that belongs to a run.
func (e *env) taskOf(typ, run string) *asynq.TaskInfo {
	e.t.Helper()
	var found []*asynq.TaskInfo
	for _, ti := range e.pendingTasks(typ) {
		if strings.HasPrefix(ti.ID, run+":") {
			found = append(found, ti)
		}
	}
	if len(found) != 1 {
		e.t.Fatalf("%d pending %s tasks of run %s, want 1", len(found), typ, run)
	}
	return found[0]
}

// archivedTask returns the archived task of a type that belongs to a run.
func (e *env) archivedTask(typ, run string) *asynq.TaskInfo {
	e.t.Helper()
	infos, err := asynq.NewInspectorFromRedisClient(e.rdb).ListArchivedTasks(e.queue)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ti := range infos {
		if ti.Type == typ && strings.HasPrefix(ti.ID, run+":") {
			return ti
		}
	}
	e.t.Fatalf("no archived %s task of run %s", typ, run)
	return nil
}
