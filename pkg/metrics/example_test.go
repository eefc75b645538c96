package metrics_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/metrics"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// One Observer per process, registered once, given to the semaphore (and
// to mapreduce.Config.Observer): its series count this process's grants,
// holds, steps and runs. worker.Main does this itself and serves /metrics.
func ExampleNewObserver() {
	opt, err := redis.ParseURL(os.Getenv("BATCHMR_TEST_REDIS_URL")) // make test sets it
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	prefix := "bmrexample:" + strconv.FormatInt(time.Now().UnixNano(), 36) // a real program keeps the default
	ctx := context.Background()

	obs := metrics.NewObserver()
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)

	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 2, Prefix: prefix, Observer: obs})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	if err := sem.Do(ctx, func(ctx context.Context) error { return nil }); err != nil {
		panic(err)
	}

	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range families {
		if mf.GetName() == "batchmr_semaphore_grants_total" {
			m := mf.GetMetric()[0]
			fmt.Println(m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
		}
	}
	for _, k := range rdb.Keys(ctx, prefix+"*").Val() {
		rdb.Del(ctx, k)
	}
	// Output: db 1
}
