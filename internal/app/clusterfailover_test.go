//go:build unix

package app_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// A Cluster client of app.Redis whose primary is killed (kill -9) writes
// to the promoted replica within seconds of the promotion, well before its
// map of slots would age out (a minute), however its writes failed
// meanwhile (refused connections, CLUSTERDOWN); and so does a Cluster
// client of the caller's own once given to semaphore.New (or
// mapreduce.New), which add the same hooks.
func TestAClusterClientWritesToThePromotedReplicaWithinSecondsOfItsPrimarysKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a Cluster primary and waits for its replica's promotion: run without -short")
	}
	t.Parallel()
	ctx := context.Background()
	const tag = "k"
	g := testenv.PrivateRedisClusterGroup(t, testenv.ClusterGroupOptions{NodeTimeout: time.Second, Tags: [3][]string{{tag}}})
	rdb, err := app.Redis(ctx, g.URL, app.RedisTLS{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	own := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{g.Primaries[1].Client.Options().Addr}})
	defer own.Close()
	sem, err := semaphore.New(own, "db", semaphore.Options{Limit: 1, Prefix: testenv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	clients := []struct {
		name string
		rdb  redis.UniversalClient
	}{{"app.Redis's client", rdb}, {"a client of the caller's own, given to semaphore.New", own}}
	key := "{" + tag + "}" + testenv.Prefix(t)
	for _, c := range clients {
		if err := c.rdb.Set(ctx, key, "before", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}

	var promoted atomic.Int64 // UnixNano
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			role, err := g.Replicas[0].Client.Do(ctx, "ROLE").Slice()
			if err == nil && len(role) > 0 && role[0] == "master" {
				promoted.Store(time.Now().UnixNano())
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	killed := time.Now()
	g.Primaries[0].Kill()
	// Write as a worker does: again and again until it succeeds.
	const bound = 10 * time.Second // the map's age would take up to a minute
	type outcome struct {
		wrote    time.Time
		failures int
		err      error
	}
	outcomes := make([]outcome, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outcomes[i]
			// Each attempt ends the wait with an outcome, at the latest a
			// minute after the kill.
			testenv.Eventually(2*time.Minute, func() bool {
				wctx, cancel := context.WithTimeout(ctx, time.Second)
				err := c.rdb.Set(wctx, key, c.name, 0).Err()
				cancel()
				if err == nil {
					o.wrote = time.Now()
					return true
				}
				o.failures++
				if p := promoted.Load(); p > 0 && time.Since(time.Unix(0, p)) > bound {
					o.err = fmt.Errorf("%v after the replica's promotion (%v after the kill), it still fails to write: %w",
						time.Since(time.Unix(0, p)).Round(time.Millisecond), time.Unix(0, p).Sub(killed).Round(time.Millisecond), err)
					return true
				}
				if time.Since(killed) > time.Minute {
					o.err = fmt.Errorf("the replica was not promoted within a minute of the kill; the write fails with %w", err)
					return true
				}
				return false
			})
		}()
	}
	wg.Wait()
	testenv.WaitFor(t, 5*time.Second, "the promotion to be seen", func() bool { return promoted.Load() > 0 })
	p := time.Unix(0, promoted.Load())
	for i, c := range clients {
		o := outcomes[i]
		if o.err != nil {
			t.Errorf("%s: %v", c.name, o.err)
			continue
		}
		t.Logf("%s: promoted %v after the kill; it wrote %v after the promotion, after %d failed writes",
			c.name, p.Sub(killed).Round(time.Millisecond), o.wrote.Sub(p).Round(time.Millisecond), o.failures)
	}
	if got := g.Replicas[0].Client.Get(ctx, key).Val(); got == "before" {
		t.Errorf("the promoted replica holds %q; want a write made after the kill", got)
	}
}
