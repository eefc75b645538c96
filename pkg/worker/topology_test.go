//go:build unix

package worker_test

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/redis/go-redis/v9"
)

// A worker whose RedisURL names a Redis Cluster, a cluster node alone,
// or the primary of Sentinels completes a whole run, its pages queued
// behind one permit and woken when it is handed on, and serves the fleet's metrics and readiness, as
// over one server; the plain URL of a cluster node gets a Cluster client,
// which asks the node for its slots.
func TestAWorkerCompletesARunOverAClusterAndASentinelURL(t *testing.T) {
	t.Parallel()
	cluster := testenv.PrivateRedisCluster(t, nil)
	node := strings.TrimPrefix(cluster.URL, "redis://")
	sentinels := testenv.PrivateSentinels(t, testenv.SentinelOptions{Password: "data-pw"})
	for _, tc := range []struct {
		name, url string
		data      *redis.Client // a plain client of the server that holds the data
	}{
		{"Cluster URL", "redis://" + node + "?addr=" + node, cluster.Client},
		{"a cluster node's plain URL", cluster.URL, cluster.Client},
		{"Sentinel URL", sentinels.URL, sentinels.Primary.Client},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slotsAsked := clusterSlotsCalls(t, cluster.Client)
			prefix := testenv.Prefix(t)
			var first atomic.Bool
			job := pagesJob("topology", func(ctx context.Context, p int) (int, error) {
				sem, err := worker.Semaphore(ctx, "db")
				if err != nil {
					return 0, err
				}
				return 2 * p, sem.Do(ctx, func(ctx context.Context) error {
					if !first.CompareAndSwap(false, true) {
						return nil
					}
					// The first holder keeps the permit until another page
					// waits for it, which then gets it handed over: woken
					// through this process's wake list.
					for {
						st, err := sem.Stats(ctx)
						if err != nil || len(st.Waiters) > 0 {
							return err
						}
						select {
						case <-ctx.Done():
							return ctx.Err()
						case <-time.After(5 * time.Millisecond):
						}
					}
				})
			}, mapreduce.JobOptions{})
			ctx := context.Background()
			metrics := startMetricsWorker(t, worker.Config{RedisURL: tc.url, Prefix: prefix, Permits: map[string]int{"db": 1},
				Concurrency: 4, PollInterval: 10 * time.Millisecond, Logger: quietLog()}, job)
			mr := mustClient(t, tc.data, prefix)
			id, err := job.Start(ctx, mr, 20, mapreduce.StartOptions{})
			if err != nil {
				t.Fatal(err)
			}
			wait, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			st, err := mr.Wait(wait, id)
			if err != nil || st.State != mapreduce.StateSucceeded {
				t.Fatalf("run %s: %+v, %v; want succeeded", id, st, err)
			}
			if sum, err := job.Result(st); err != nil || sum != 2*(19*20/2) {
				t.Errorf("result %d, %v; want %d", sum, err, 2*(19*20/2))
			}
			// The fleet's gauges are read from Redis at each scrape.
			m := scrapeMetrics(t, metrics)
			if up, limit := m.must(t, "batchmr_fleet_up"), m.must(t, "batchmr_semaphore_limit", "semaphore=db"); up != 1 || limit != 1 {
				t.Errorf("/metrics: batchmr_fleet_up %v, batchmr_semaphore_limit %v; want 1 and the limit of 1", up, limit)
			}
			if code, body := get(t, metrics+"/readyz"); code != http.StatusOK {
				t.Errorf("/readyz: %d %s; want 200", code, body)
			}
			asked := clusterSlotsCalls(t, cluster.Client) > slotsAsked
			if wantCluster := tc.data == cluster.Client; asked != wantCluster {
				t.Errorf("the cluster node was asked for its slots: %v; want %v (a Cluster client: %v)", asked, wantCluster, wantCluster)
			}
		})
	}
}

// clusterSlotsCalls is how many CLUSTER SLOTS the node has answered: a
// go-redis Cluster client asks, a plain client never does.
func clusterSlotsCalls(t *testing.T, node *redis.Client) int {
	t.Helper()
	info, err := node.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_cluster\|slots:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
