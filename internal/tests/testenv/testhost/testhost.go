// Package testhost runs jobs in a test as a worker process does: an asynq
// server on the jobs' queues and an announcement in the catalogue. It is
// for the tests of the commands and the console, which need workers but
// not the whole pkg/worker runtime; it lives apart from testenv so that
// testenv stays free of pkg/mapreduce.
package testhost

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Options shape a hosted worker.
type Options struct {
	Prefix      string   // the deployment's key prefix (testenv.Redis's)
	Concurrency int      // tasks at once; default 4
	Semaphores  []string // the semaphores the announcement names
	Database    *bool    // what the announcement says of the worker's database (nil: nothing)
	Logger      *slog.Logger
}

// Host runs jobs as a worker does until stop is called or the test ends,
// with short intervals so that tests run fast. It returns once the
// catalogue lists the worker, with the worker's announcement. The jobs'
// queues are removed when the test ends.
func Host(t testing.TB, rdb *redis.Client, o Options, jobs ...mapreduce.AnyJob) (info mapreduce.WorkerInfo, stop func()) {
	t.Helper()
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	reg := mapreduce.NewJobs()
	for _, j := range jobs {
		if err := reg.Add(j); err != nil {
			t.Fatal(err)
		}
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Jobs: reg, Prefix: o.Prefix, Logger: o.Logger, CancelPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mr.ServerConfig(asynq.Config{
		Concurrency:              o.Concurrency,
		TaskCheckInterval:        10 * time.Millisecond,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		ShutdownTimeout:          2 * time.Second,
		LogLevel:                 asynq.FatalLevel,
	})
	if err != nil {
		t.Fatal(err)
	}
	for q := range cfg.Queues {
		testenv.RemoveQueue(t, rdb, q)
	}
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mr.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	info = mr.NewWorkerInfo()
	info.Semaphores = o.Semaphores
	info.Database = o.Database
	ctx, cancel := context.WithCancel(context.Background())
	announced := make(chan struct{})
	go func() {
		defer close(announced)
		if err := mr.Announce(ctx, info); err != nil {
			t.Errorf("announce: %v", err)
		}
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-announced
		srv.Shutdown()
	})
	t.Cleanup(stop)
	// Observing state, not timing the code: the announcement lands within
	// moments.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, _ := mr.Workers(context.Background())
		if slices.ContainsFunc(ws, func(w mapreduce.WorkerInfo) bool { return w.ID == info.ID }) {
			return info, stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("the catalogue did not list the hosted worker %s within 5s", info.ID)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
