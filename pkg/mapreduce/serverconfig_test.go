package mapreduce_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// A server that ServerConfig completed serves the jobs' queues, polls
// every 100 ms, and keeps the server's own retry policy for its other
// tasks, while batchmr's tasks ride out an outage without spending a
// retry, even where the server's own IsFailure calls every error one.
func TestServerConfigKeepsTheServersOwnPolicyForItsOtherTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := &flaky{calls: map[int]int{}}
	e.addJob(e.jobs.Add(flakyJob("outage", f, 2, outage, e.opts(mapreduce.JobOptions{
		MapRetries:       -1, // none: a counted failure fails the run
		TransientBackoff: func(int) time.Duration { return 20 * time.Millisecond },
	}))))
	c := e.client()
	if cfg, err := c.ServerConfig(asynq.Config{}); err != nil || cfg.TaskCheckInterval != mapreduce.DefaultPollInterval || len(cfg.Queues) != 1 || cfg.Queues[e.queue] != 1 {
		t.Fatalf("ServerConfig of an empty config: poll %v, queues %v, %v; want %v and %s", cfg.TaskCheckInterval, cfg.Queues, err, mapreduce.DefaultPollInterval, e.queue)
	}
	other := e.queue + ":other"
	var mu sync.Mutex
	var delayed []string // the task types the server's own RetryDelayFunc was asked about
	var sends sync.WaitGroup
	sends.Add(2)
	e.serve(c, asynq.Config{
		Concurrency:              4,
		Queues:                   map[string]int{e.queue: 1, other: 1},
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		LogLevel:                 asynq.FatalLevel,
		RetryDelayFunc: func(n int, err error, task *asynq.Task) time.Duration {
			mu.Lock()
			delayed = append(delayed, task.Type())
			mu.Unlock()
			return 10 * time.Millisecond
		},
		IsFailure: func(error) bool { return true },
	}, func(mux *asynq.ServeMux) {
		mux.HandleFunc("report:email", func(context.Context, *asynq.Task) error {
			sends.Done()
			return errors.New("smtp: try again") // fails once, then the retry
		})
	})
	ac := asynq.NewClientFromRedisClient(e.rdb)
	if _, err := ac.Enqueue(asynq.NewTask("report:email", nil), asynq.Queue(other), asynq.MaxRetry(1)); err != nil {
		t.Fatal(err)
	}
	id := mustStart(t, c, "outage", sumArgs{N: 200, PageSize: 100}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Failed != 0 {
		t.Fatalf("run ended %s with %d failed pages (%s); want succeeded: an outage's errors spent retries", st.State, st.Failed, st.Error)
	}
	done := make(chan struct{})
	go func() { sends.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the other task was not retried within 10 s: the server's own RetryDelayFunc (10 ms) was not used for it")
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(delayed, ",") != "report:email" {
		t.Errorf("the server's own RetryDelayFunc was asked about %v; want only the other task, once", delayed)
	}
}

// A config whose queues leave out a job's queue is refused, naming it:
// that job's tasks would never run.
func TestServerConfigRefusesQueuesWithoutTheJobsQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(e.jobs.Add(sumJob("sums", newCounts(), e.opts(mapreduce.JobOptions{}))))
	_, err := e.client().ServerConfig(asynq.Config{Queues: map[string]int{"default": 1}})
	if err == nil || !strings.Contains(err.Error(), "lacks "+e.queue) || !strings.Contains(err.Error(), "leave Queues nil") {
		t.Errorf("ServerConfig without the job's queue: %v; want an error naming %s and the fix", err, e.queue)
	}
	// asynq drops a queue of weight 0.
	if _, err := e.client().ServerConfig(asynq.Config{Queues: map[string]int{e.queue: 0, "default": 1}}); err == nil || !strings.Contains(err.Error(), "weight below 1") {
		t.Errorf("ServerConfig with the job's queue at weight 0: %v; want an error naming the weight", err)
	}
	// asynq serves "default" when Queues is empty: a client without jobs
	// would run nothing of its own there.
	none, err := mapreduce.New(e.rdb, mapreduce.Config{Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := none.ServerConfig(asynq.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Jobs") {
		t.Errorf("ServerConfig of a client without jobs: %v; want an error saying to pass Config.Jobs", err)
	}
}

// A server's own IsFailure, written for its other tasks, does not decide
// for batchmr's: a page that keeps failing with an error the server's
// function does not count still spends the job's retries and fails its
// run, instead of running for ever.
func TestServerConfigLetsOnlyBatchmrCountItsTasksFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := &flaky{calls: map[int]int{}}
	e.addJob(e.jobs.Add(flakyJob("timeouts", f, 1000, context.DeadlineExceeded, e.opts(mapreduce.JobOptions{MapRetries: 1}))))
	c := e.client()
	e.serve(c, asynq.Config{Concurrency: 2, DelayedTaskCheckInterval: 50 * time.Millisecond, LogLevel: asynq.FatalLevel,
		IsFailure: func(err error) bool { return !errors.Is(err, context.DeadlineExceeded) }}, nil)
	id := mustStart(t, c, "timeouts", sumArgs{N: 10, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateFailed || st.Failed != 1 {
		t.Fatalf("run ended %s with %d failed pages; want failed, its one page failed after its retries", st.State, st.Failed)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.calls[0]; n != 2 {
		t.Errorf("Map ran %d times, want 2: once and one retry (MapRetries 1)", n)
	}
}
