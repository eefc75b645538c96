package mapreduce_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// On Redis Cluster every script must touch one slot. A whole run, and the
// overlap check that reads another run's record, work on a real cluster,
// and every key batchmr wrote for the job is in one slot.
func TestRunsWorkOnRedisCluster(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.RedisCluster(t)
	ctx := context.Background()
	queue := strings.ReplaceAll(prefix, ":", "-")
	t.Cleanup(func() {
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			deleteQueue(node, queue)
			return nil
		})
	})
	jobs := mapreduce.NewJobs()
	cnt := newCounts()
	if err := mapreduce.AddJob(jobs, sumJob("sum", cnt, mapreduce.JobOptions{Queue: queue})); err != nil {
		t.Fatal(err)
	}
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}

	id := mustStart(t, c, "sum", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{})
	if _, err := c.StartAny(ctx, "sum", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrRunActive) {
		t.Fatalf("second Start: %v, want ErrRunActive", err)
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 4, Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	c.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 100*99/2 {
		t.Fatalf("state %s (%s), want succeeded with %d", st.State, st.Error, 100*99/2)
	}
	testenv.KeysInOneSlot(t, rdb, prefix, 4)
}

// Runs of different jobs hash to different slots, which a Cluster may give
// to different primaries: runs of two jobs complete side by side, each
// job's keys on its own primary.
func TestRunsOfDifferentJobsWorkOnDifferentPrimaries(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.RedisCluster(t)
	ctx := context.Background()
	queue := strings.ReplaceAll(prefix, ":", "-")
	t.Cleanup(func() {
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			deleteQueue(node, queue)
			return nil
		})
	})
	names := testenv.TagsOnDifferentPrimaries(t, rdb, 2)
	jobs := mapreduce.NewJobs()
	for _, name := range names {
		if err := mapreduce.AddJob(jobs, sumJob(name, newCounts(), mapreduce.JobOptions{Queue: queue})); err != nil {
			t.Fatal(err)
		}
	}
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, name := range names {
		ids = append(ids, mustStart(t, c, name, sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{}))
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 4, Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	c.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	for _, id := range ids {
		st := wait(t, c, id, 30*time.Second)
		if st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 100*99/2 {
			t.Fatalf("run %s: state %s (%s), want succeeded with %d", id, st.State, st.Error, 100*99/2)
		}
	}
	testenv.PrimariesOfTags(t, rdb, prefix, "job", names...)
}
