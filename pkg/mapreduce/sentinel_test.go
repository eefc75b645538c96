package mapreduce_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// Through Sentinels, the client, and asynq's server over it, find the
// primary, and a whole run completes there as on one server.
func TestRunsWorkThroughSentinels(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.RedisSentinel(t)
	queue := strings.ReplaceAll(prefix, ":", "-")
	t.Cleanup(func() { deleteQueue(rdb, queue) })
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, sumJob("sum", newCounts(), mapreduce.JobOptions{Queue: queue})); err != nil {
		t.Fatal(err)
	}
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	id := mustStart(t, c, "sum", sumArgs{N: 100, PageSize: 10}, mapreduce.StartOptions{})
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
	if n := len(rdb.Keys(context.Background(), prefix+"*").Val()); n == 0 {
		t.Errorf("no keys under %s on the primary the Sentinels name", prefix)
	}
}
