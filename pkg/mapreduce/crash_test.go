package mapreduce_test

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// The crash tests run a worker as a subprocess (this test binary, with
// MRTEST_WORKER set), let it take part of a run, make it hang at one step,
// kill -9 it there, and check that another worker finishes the run with the
// right result. asynq hands a dead worker's task to another worker once its
// lease (30 s) has been expired for 30 s, when that worker's recoverer runs
// (at start, then every minute): so the replacement starts 61 s after the
// kill, and each test takes about a minute. They run in parallel.

const (
	workerEnv = "MRTEST_WORKER" // the step to hang at: split, map, pages (map, in a task of several pages) or reduce
	prefixEnv = "MRTEST_PREFIX"
	queueEnv  = "MRTEST_QUEUE"
)

func TestMain(m *testing.M) {
	if hang := os.Getenv(workerEnv); hang != "" {
		os.Exit(runCrashWorker(hang))
	}
	os.Exit(m.Run())
}

// crashJob sums 0..39 in ten pages. hang, if not nil, is called at the step
// named by at and never returns.
func crashJob(queue, at string, hang func()) mapreduce.Job[sumArgs, span, int, int] {
	// asynq retries a dead worker's task after the job's Backoff: keep it
	// short, as the default (15-45 s at first) would only slow the test.
	j := sumJob("crashy", newCounts(), mapreduce.JobOptions{Queue: queue,
		Backoff: func(int, error) time.Duration { return 10 * time.Millisecond }})
	inner := j.Reduce
	j.Split = func(ctx context.Context, a sumArgs, emit func(span) error) error {
		for lo := 0; lo < a.N; lo += a.PageSize {
			if at == "split" && lo == 4*a.PageSize {
				hang() // mid-split: four pages are enqueued
			}
			if err := emit(span{lo, min(lo+a.PageSize, a.N)}); err != nil {
				return err
			}
		}
		return nil
	}
	j.Map = func(ctx context.Context, p span) (int, error) {
		if (at == "map" || at == "pages") && p.Lo == 8 {
			hang()
		}
		return sumSpan(p), nil
	}
	j.Reduce = func(ctx context.Context, a sumArgs, pages iter.Seq2[mapreduce.PageResult[span, int], error]) (int, error) {
		if at == "reduce" {
			hang()
		}
		return inner(ctx, a, pages)
	}
	return j
}

// runCrashWorker is the subprocess: a worker that hangs at one step, after
// saying so in Redis, until it is killed.
func runCrashWorker(at string) int {
	opt, err := redis.ParseURL(os.Getenv(testenv.RedisURLVar))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rdb := redis.NewClient(opt)
	prefix, queue := os.Getenv(prefixEnv), os.Getenv(queueEnv)
	jobs := mapreduce.NewJobs()
	hang := func() {
		rdb.Set(context.Background(), prefix+":hung", at, 0)
		select {}
	}
	if err := mapreduce.AddJob(jobs, crashJob(queue, at, hang)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: 4, Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel,
	})
	mux := asynq.NewServeMux()
	c.Register(mux)
	if err := srv.Run(mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestWorkersKilledMidSplitMapAndReduceLoseNothing kills a worker in the
// middle of each step, in four runs at once (so that the suite waits for
// asynq's recovery once), then starts replacements. "pages" is a Map in a
// task of four pages, two of which ran Map but were not recorded yet.
func TestWorkersKilledMidSplitMapAndReduceLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits a minute for asynq to recover the dead workers' tasks")
	}
	t.Parallel()
	ctx := context.Background()
	type crash struct {
		at  string
		e   *env
		c   *mapreduce.Client
		run string
	}
	var crashes []*crash
	var lastKill time.Time
	t.Logf("%s: start", time.Now().Format("15:04:05.000"))
	for _, at := range []string{"split", "map", "pages", "reduce"} {
		e := newEnv(t)
		e.addJob(mapreduce.AddJob(e.jobs, crashJob(e.queue, "", nil)))
		cr := &crash{at: at, e: e, c: e.client()}
		crashes = append(crashes, cr)

		cr.run = mustStart(t, cr.c, "crashy", sumArgs{N: 40, PageSize: 4}, mapreduce.StartOptions{})
		if at == "pages" {
			if err := cr.c.SetPacking(ctx, cr.run, 4, 0); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+at, prefixEnv+"="+e.prefix, queueEnv+"="+e.queue,
			testenv.RedisURLVar+"="+testenv.RedisURL(t))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		testenv.WaitFor(t, 30*time.Second, "the worker to hang at "+at, func() bool {
			return e.rdb.Get(ctx, e.prefix+":hung").Val() == at
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		lastKill = time.Now()
		t.Logf("%s: killed the worker hung at %s", lastKill.Format("15:04:05.000"), at)
		_ = cmd.Wait()
		if st, err := cr.c.Status(ctx, cr.run); err != nil || st.State.Ended() {
			t.Fatalf("%s: after the kill: %+v, %v; want the run unfinished", at, st, err)
		}
	}

	// asynq's recoverer, which runs as a server starts, takes back a task
	// whose lease ran out 30 s ago or more: wait until every dead
	// worker's lease has (a lease runs 30 s past the last heartbeat).
	testenv.WaitFor(t, 70*time.Second, "the dead workers' leases to run out 30 s ago", func() bool {
		now, err := crashes[0].e.rdb.Time(ctx).Result()
		if err != nil {
			return false
		}
		cutoff := strconv.FormatInt(now.Add(-30*time.Second).Unix(), 10)
		for _, cr := range crashes {
			if n, err := cr.e.rdb.ZCount(ctx, "asynq:{"+cr.e.queue+"}:lease", "("+cutoff, "+inf").Result(); err != nil || n > 0 {
				return false
			}
		}
		return true
	})
	t.Logf("%s: leases out %v after the last kill", time.Now().Format("15:04:05.000"), time.Since(lastKill).Round(time.Millisecond))
	for _, cr := range crashes {
		cr.e.worker(cr.c, 4)
	}
	t.Logf("%s: replacement workers started", time.Now().Format("15:04:05.000"))
	for _, cr := range crashes {
		st := wait(t, cr.c, cr.run, 60*time.Second)
		t.Logf("%s: the run killed mid-%s ended %s", time.Now().Format("15:04:05.000"), cr.at, st.State)
		if st.State != mapreduce.StateSucceeded {
			t.Errorf("killed mid-%s: state %s (%s), want succeeded", cr.at, st.State, st.Error)
			continue
		}
		if got := resultOf(t, cr.c, st); got != 40*39/2 || st.Total != 10 || st.Done != 10 || st.Failed != 0 {
			t.Errorf("killed mid-%s: result %d, total %d, done %d, failed %d; want %d from 10 pages",
				cr.at, got, st.Total, st.Done, st.Failed, 40*39/2)
		}
	}
}
