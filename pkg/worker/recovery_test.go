package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/redis/go-redis/v9"
)

// A worker killed mid-page leaves its tasks "active" in asynq. asynq's own
// recoverer takes them back only a minute or more later (30s of lease, 30s
// of grace, a pass a minute), and never while their leases lie in the
// future, as a worker with a fast clock writes them. Another worker copies
// them within seconds instead, so the run ends exact: here with the dead
// worker's leases pushed 2h ahead, as a fast clock would have scored them.
func TestPagesOfAKilledWorkerWithAFastClockAreTakenOverWithinSeconds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	queue := testenv.JobQueue(t, rdb, prefix, "squares")
	bin := testenv.Build(t, "./testdata/squares")
	env := append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t), "BATCHMR_PREFIX="+prefix)
	args := []string{"--permits", "cpu=8", "--concurrency", "4", "--poll-interval", "20ms", "--log-level", "info"}
	doomed := startProc(t, bin, env, args...)

	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	waitAnnounced(t, mr, "squares", 1)
	id, err := mr.StartJSON(ctx, "squares", []byte(`{"n": 400, "page_size": 10, "sleep_ms": 400}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leases := "asynq:{" + queue + "}:lease"
	var st *mapreduce.Status
	atWork := false
	defer func() {
		if !atWork {
			t.Logf("run: %+v\n%s", st, doomed.output())
		}
	}()
	testenv.WaitFor(t, 20*time.Second, "the worker to have 4 pages at work", func() bool {
		if st, err = mr.Status(ctx, id); err != nil {
			t.Fatal(err)
		}
		n, _ := rdb.ZCard(ctx, leases).Result()
		return st.Done >= 4 && n == 4
	})
	atWork = true
	if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = doomed.cmd.Wait()
	killed := time.Now()
	held, err := rdb.ZRangeWithScores(ctx, leases, 0, -1).Result()
	if err != nil || len(held) == 0 {
		t.Fatalf("no leases of the killed worker's tasks (%v)", err)
	}
	for _, z := range held {
		rdb.ZAddXX(ctx, leases, redis.Z{Member: z.Member, Score: z.Score + 7200})
	}

	rescuer := startProc(t, bin, env, args...)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err = mr.Wait(wctx, id)
	if err != nil {
		t.Fatalf("the run did not end: %v\n%s", err, rescuer.output())
	}
	took := time.Since(killed)
	t.Logf("the run ended %v after the kill, %d pages taken over", took.Round(100*time.Millisecond), len(held))
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("run ended %s: %s", st.State, st.Error)
	}
	var sum int
	if err := json.Unmarshal(st.Result, &sum); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range 400 {
		want += i * i
	}
	if sum != want {
		t.Errorf("result %d, want %d", sum, want)
	}
	// The orphans are found once the dead server's entry expires (10s on
	// Redis's clock) and have been seen for 8s; the rest of the run takes
	// 4s. asynq alone would not have finished it in an hour.
	if took > 30*time.Second {
		t.Errorf("the run ended %v after the worker was killed; want its pages taken over within ~20s", took)
	}
	if !strings.Contains(rescuer.output(), "enqueued a copy") {
		t.Errorf("the rescuer did not log the orphans it copied:\n%s", rescuer.output())
	}
}

// waitAnnounced waits until n live workers announce job.
func waitAnnounced(t *testing.T, mr *mapreduce.Client, job string, n int) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d workers of %s to announce it", n, job), func() bool {
		info, err := mr.Job(context.Background(), job)
		return err == nil && len(info.Workers) >= n
	})
}

// A host whose clock is far from Redis's would lease tasks on a clock the
// rest of the fleet does not share: the worker refuses to start, giving
// the offset and the fix, and takes no task.
func TestAWorkerWhoseClockIsOffFromRedisRefusesToStart(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, "skewed")
	for _, skew := range []time.Duration{2 * time.Hour, -10 * time.Second} {
		cfg := worker.WithClock(worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix},
			func() time.Time { return time.Now().Add(skew) })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := worker.Run(ctx, cfg, skewedJob)
		cancel()
		if err == nil {
			t.Fatalf("skew %v: Run started", skew)
		}
		way := "ahead of"
		if skew < 0 {
			way = "behind"
		}
		for _, want := range []string{way + " Redis's", "--max-clock-offset", "sync the clock"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("skew %v: error %q does not say %q", skew, err, want)
			}
		}
		if jobs, _ := mustClient(t, rdb, prefix).Jobs(context.Background()); len(jobs) != 0 {
			t.Errorf("skew %v: the refused worker announced %+v", skew, jobs)
		}
	}
	// Within the limit it starts.
	cfg := worker.WithClock(worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix, MaxClockOffset: 5 * time.Second},
		func() time.Time { return time.Now().Add(2 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := worker.Run(ctx, cfg, skewedJob); err != nil {
		t.Fatalf("a clock 2s off with a 5s limit: %v", err)
	}
}

var skewedJob = mapreduce.Job[int, int, int, int]{
	Name:  "skewed",
	Split: func(context.Context, int, func(int) error) error { return nil },
	Map:   func(context.Context, int) (int, error) { return 0, nil },
}

func mustClient(t *testing.T, rdb redis.UniversalClient, prefix string) *mapreduce.Client {
	t.Helper()
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return mr
}
