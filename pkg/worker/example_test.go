package worker_test

import (
	"context"
	"fmt"
	"iter"
	"os"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/redis/go-redis/v9"
)

// lengths sums the lengths of some words, a page per word; its Map takes a
// permit of the worker's "cpu" semaphore.
var lengths = mapreduce.Job[[]string, string, int, int]{
	Name: "lengths",
	Split: func(ctx context.Context, words []string, emit func(string) error) error {
		for _, w := range words {
			if err := emit(w); err != nil {
				return err
			}
		}
		return nil
	},
	Map: func(ctx context.Context, word string) (int, error) {
		cpu, err := worker.Semaphore(ctx, "cpu")
		if err != nil {
			return 0, err
		}
		n := 0
		err = cpu.Do(ctx, func(context.Context) error { n = len(word); return nil })
		return n, err
	},
	Reduce: func(ctx context.Context, _ []string, pages iter.Seq2[mapreduce.PageResult[string, int], error]) (int, error) {
		total := 0
		for p, err := range pages {
			if err != nil {
				return 0, err
			}
			total += p.Result
		}
		return total, nil
	},
}

// A worker in-process with Run (a worker binary calls worker.Main(jobs...)
// instead), and a run started, typed, by a client that runs no job.
func ExampleRun() {
	redisURL := os.Getenv("BATCHMR_TEST_REDIS_URL") // make test sets it
	// A prefix of its own, so that the example runs beside other users of
	// the server; a deployment keeps one prefix.
	prefix := "bmrexample:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() {
		stopped <- worker.Run(ctx, worker.Config{RedisURL: redisURL, Prefix: prefix,
			Permits: map[string]int{"cpu": 2}, PollInterval: 10 * time.Millisecond}, lengths)
	}()

	opt, _ := redis.ParseURL(redisURL)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	defer exampleCleanup(rdb, prefix, prefix+":lengths")
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	id, err := lengths.Start(ctx, mr, []string{"fleet", "wide", "permits"}, mapreduce.StartOptions{})
	if err != nil {
		panic(err)
	}
	st, err := mr.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	total, err := lengths.Result(st)
	fmt.Println(st.State, total, err)
	stop()
	fmt.Println("worker stopped:", <-stopped)
	// Output:
	// succeeded 16 <nil>
	// worker stopped: <nil>
}

// A job's Map called directly, as a unit test of the job does: NewContext
// hands it what a worker would, here a semaphore of the test's own, so
// that worker.Semaphore (and worker.Database, given Env.DB and a "db"
// semaphore) find it.
func ExampleNewContext() {
	opt, _ := redis.ParseURL(os.Getenv("BATCHMR_TEST_REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	prefix := "bmrexample:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer exampleCleanup(rdb, prefix, prefix)
	cpu, err := semaphore.New(rdb, "cpu", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer cpu.Close()

	ctx := worker.NewContext(context.Background(), &worker.Env{
		Redis:      rdb,
		Semaphores: map[string]*semaphore.Semaphore{"cpu": cpu},
	})
	n, err := lengths.Map(ctx, "permits")
	fmt.Println(n, err)

	// Without the semaphore, the error names it and the fix.
	_, err = lengths.Map(worker.NewContext(context.Background(), &worker.Env{Redis: rdb}), "permits")
	fmt.Println(err)
	// Output:
	// 7 <nil>
	// worker.Semaphore: this worker has no semaphore "cpu" (it has: none): open it with --permits cpu=N (Config.Permits); in a test through worker.NewContext, put one in Env.Semaphores (semaphore.New)
}

func exampleCleanup(rdb *redis.Client, prefix, queue string) {
	ctx := context.Background()
	for _, pattern := range []string{prefix + "*", "asynq:{" + queue + "}:*"} {
		for _, k := range rdb.Keys(ctx, pattern).Val() {
			rdb.Del(ctx, k)
		}
	}
	rdb.SRem(ctx, "asynq:queues", queue)
}

// A worker binary's whole main function: its flags and their environment
// variables (--help lists them) configure it, and it runs until SIGTERM or
// SIGINT. (Not run here: it would take the test's command line.)
func ExampleMain() {
	worker.Main(lengths)
}

// MainWith sets what no flag does, here the "cpu" semaphore that the
// job's Map takes, before the worker starts; every flag still works.
func ExampleMainWith() {
	worker.MainWith(func(cfg *worker.Config) {
		cfg.Permits = map[string]int{"cpu": 4}
	}, lengths)
}
