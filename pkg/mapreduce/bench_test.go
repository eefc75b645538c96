package mapreduce_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// BenchmarkReconcilePass is one reconcile pass over a job that keeps 1,440
// ended runs (one a minute for the default 24 h retention) and 4 in
// progress: it reads the job's index of unfinished runs, not every run
// kept. Redis CPU per pass is that of the whole server: run it alone.
//
//	go test -run '^$' -bench ReconcilePass -count 5 ./pkg/mapreduce/
func BenchmarkReconcilePass(b *testing.B) {
	rdb, prefix := testenv.Redis(b)
	queue := testenv.Queue(b, rdb, prefix)
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, sumJob("sum", newCounts(), mapreduce.JobOptions{Queue: queue, AllowOverlap: true})); err != nil {
		b.Fatal(err)
	}
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const ended, live = 1440, 4
	for i := range ended + live {
		id, err := c.StartAny(ctx, "sum", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if i < ended {
			if err := c.Cancel(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu := benchutil.RedisCPU(ctx, rdb)
	for b.Loop() {
		if _, err := c.Reconcile(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchutil.RedisCPU(ctx, rdb)-cpu)/float64(time.Microsecond)/float64(b.N), "redis-µs/op")
}
