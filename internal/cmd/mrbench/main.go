// Command mrbench measures pkg/mapreduce against a real Redis: a large run
// of no-op pages (split fan-out rate, end-to-end pages per second, Redis
// memory per page), and the framework's overhead over a bare asynq handler
// processing the same number of no-op tasks, interleaved in one run.
//
//	go run ./internal/cmd/mrbench -redis redis://127.0.0.1:6379/0
//
// It writes only under a fresh "mrbench:<random>" prefix and its own asynq
// queues, and deletes them afterwards.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/benchutil"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

var (
	redisURL    = flag.String("redis", os.Getenv("BATCHMR_TEST_REDIS_URL"), "Redis URL (default $BATCHMR_TEST_REDIS_URL)")
	pages       = flag.Int("pages", 100_000, "pages of the large run")
	tasks       = flag.Int("tasks", 20_000, "no-op tasks per overhead comparison round")
	repeat      = flag.Int("repeat", 3, "interleaved rounds of the overhead comparison; medians are reported")
	concurrency = flag.Int("concurrency", 32, "asynq worker concurrency in every measurement")
	only        = flag.String("only", "", "run only these sections, comma-separated: large,overhead")
)

func main() {
	flag.Parse()
	rdb := benchutil.Redis("mrbench", *redisURL, 4**concurrency)
	defer rdb.Close()
	ctx := context.Background()
	base := fmt.Sprintf("mrbench:%08x", rand.Uint32())
	var queues []string
	defer func() { cleanup(rdb, base, queues) }()
	info, _ := rdb.Info(ctx, "server").Result()
	fmt.Printf("# mrbench: %s, Go %s, %d CPUs, Redis %s, asynq concurrency %d\n\n", time.Now().Format("2006-01-02"),
		runtime.Version(), runtime.NumCPU(), benchutil.InfoField(info, "redis_version"), *concurrency)

	want := func(s string) bool { return *only == "" || slices.Contains(strings.Split(*only, ","), s) }
	if want("large") {
		q := base + "-large"
		queues = append(queues, q)
		large(ctx, rdb, base+":large", q)
	}
	if want("overhead") {
		var bare, mr []time.Duration
		for r := range *repeat {
			qb, qm := fmt.Sprintf("%s-bare-%d", base, r), fmt.Sprintf("%s-mr-%d", base, r)
			queues = append(queues, qb, qm)
			bare = append(bare, bareRound(ctx, rdb, qb))
			mr = append(mr, mapreduceRound(ctx, rdb, fmt.Sprintf("%s:mr%d", base, r), qm, *tasks))
		}
		b, m := benchutil.Median(bare), benchutil.Median(mr)
		fmt.Printf("## Framework overhead: %d no-op tasks, bare asynq handler vs one mapreduce run (%d interleaved rounds, medians)\n\n", *tasks, *repeat)
		fmt.Println("| | bare asynq | mapreduce run | ratio (target ≤ 1.5) |")
		fmt.Println("|---|---|---|---|")
		fmt.Printf("| wall time | %v | %v | **%.2f** |\n", b.Round(time.Millisecond), m.Round(time.Millisecond), float64(m)/float64(b))
		fmt.Printf("| tasks/s | %.0f | %.0f | |\n", float64(*tasks)/b.Seconds(), float64(*tasks)/m.Seconds())
		fmt.Printf("| rounds | %s | %s | |\n\n", durs(bare), durs(mr))
	}
}

func newServer(rdb *redis.Client, queue string) *asynq.Server {
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:       *concurrency,
		Queues:            map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond,
		LogLevel:          asynq.ErrorLevel,
	})
}

// noop is the job of both sections: a split of n pages, a Map that does
// nothing, a Reduce that counts.
func noopJobs(queue string) *mapreduce.Jobs {
	jobs := mapreduce.NewJobs()
	must(mapreduce.AddJob(jobs, noopJob(queue)))
	return jobs
}

// noopJob is a job of n pages whose Map does nothing.
func noopJob(queue string) mapreduce.Job[int, int, struct{}, int] {
	return mapreduce.Job[int, int, struct{}, int]{
		Name: "noop",
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(context.Context, int) (struct{}, error) { return struct{}{}, nil },
		Options: mapreduce.JobOptions{Queue: queue, Retention: time.Minute,
			Semantics: mapreduce.CompleteSemantics, MapRetries: -1},
	}
}

func newClient(rdb *redis.Client, prefix, queue string) *mapreduce.Client {
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: noopJobs(queue), Prefix: prefix,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	must(err)
	return c
}

// runAndWait starts a run of n pages with a worker serving it, and returns
// its final status, polling every 5 ms so that the poll does not pad the time.
func runAndWait(ctx context.Context, rdb *redis.Client, c *mapreduce.Client, queue string, n int, during func()) *mapreduce.Status {
	srv := newServer(rdb, queue)
	mux := asynq.NewServeMux()
	c.Register(mux)
	must(srv.Start(mux))
	defer srv.Shutdown()
	id, err := noopJob(queue).Start(ctx, c, n, mapreduce.StartOptions{})
	must(err)
	for {
		st, err := c.Status(ctx, id)
		must(err)
		if during != nil {
			during()
		}
		if st.State.Ended() {
			if st.State != mapreduce.StateSucceeded {
				must(fmt.Errorf("run %s ended %s: %s", id, st.State, st.Error))
			}
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func large(ctx context.Context, rdb *redis.Client, prefix, queue string) {
	c := newClient(rdb, prefix, queue)
	baseMem := usedMemory(ctx, rdb)
	var peak int64
	var samples int
	lastSample := time.Time{}
	st := runAndWait(ctx, rdb, c, queue, *pages, func() {
		if time.Since(lastSample) < 50*time.Millisecond {
			return
		}
		lastSample = time.Now()
		samples++
		peak = max(peak, usedMemory(ctx, rdb)-baseMem)
	})
	var own int64
	for _, kind := range []string{"run", "recorded", "results", "failures"} {
		n, _ := rdb.MemoryUsage(ctx, prefix+":{noop}:"+kind+":"+st.ID, 0).Result()
		own += n
	}
	splitFor := st.SplitDone.Sub(st.Created)
	total := st.Finished.Sub(st.Created)
	fmt.Printf("## A %d-page run, no-op Map\n\n", *pages)
	fmt.Println("| split fan-out (pages enqueued/s) | end-to-end pages/s | split time | run time | Redis memory per page: peak of the live run | the run's own keys, finished |")
	fmt.Println("|---|---|---|---|---|---|")
	fmt.Printf("| %.0f | %.0f | %v | %v | %.0f B (peak +%.1f MiB over %d samples) | %.1f B |\n\n",
		float64(st.Total)/splitFor.Seconds(), float64(st.Total)/total.Seconds(),
		splitFor.Round(time.Millisecond), total.Round(time.Millisecond),
		float64(peak)/float64(st.Total), float64(peak)/(1<<20), samples, float64(own)/float64(st.Total))
}

func mapreduceRound(ctx context.Context, rdb *redis.Client, prefix, queue string, n int) time.Duration {
	c := newClient(rdb, prefix, queue)
	start := time.Now()
	runAndWait(ctx, rdb, c, queue, n, nil)
	return time.Since(start)
}

// bareRound enqueues n no-op tasks, 16 at a time like a split, into a
// queue a server with the same concurrency drains, and times the lot.
func bareRound(ctx context.Context, rdb *redis.Client, queue string) time.Duration {
	n := *tasks
	var processed atomic.Int64
	done := make(chan struct{})
	srv := newServer(rdb, queue)
	must(srv.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if processed.Add(1) == int64(n) {
			close(done)
		}
		return nil
	})))
	defer srv.Shutdown()
	aq := asynq.NewClientFromRedisClient(rdb)
	defer aq.Close()
	start := time.Now()
	work := make(chan int, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, err := aq.EnqueueContext(ctx, asynq.NewTask("noop", []byte(`{"i":`+strconv.Itoa(i)+`}`)),
					asynq.Queue(queue), asynq.TaskID(queue+":"+strconv.Itoa(i)), asynq.MaxRetry(0))
				must(err)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	<-done
	return time.Since(start)
}

func usedMemory(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	must(err)
	n, _ := strconv.ParseInt(benchutil.InfoField(info, "used_memory"), 10, 64)
	return n
}

func cleanup(rdb *redis.Client, base string, queues []string) {
	patterns := []string{base + "*"}
	for _, q := range queues {
		patterns = append(patterns, "asynq:{"+q+"}:*")
		rdb.SRem(context.Background(), "asynq:queues", q)
	}
	benchutil.DeleteMatching(rdb, patterns...)
}

func durs(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return strings.Join(parts, " ")
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mrbench:", err)
		os.Exit(1)
	}
}
