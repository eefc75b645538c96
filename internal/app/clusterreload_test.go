//go:build unix

package app_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/testenv"
)

// A Cluster client of app.Redis whose primary is killed (kill -9) writes
// to the promoted replica within seconds of the promotion, well before its
// map of slots would age out (a minute), however its writes failed
// meanwhile (refused connections, CLUSTERDOWN).
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
	key := "{" + tag + "}" + testenv.Prefix(t)
	if err := rdb.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
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
	var failures int
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Set(wctx, key, "after", 0).Err()
		cancel()
		if err == nil {
			break
		}
		failures++
		if p := promoted.Load(); p > 0 && time.Since(time.Unix(0, p)) > bound {
			t.Fatalf("%v after the replica's promotion (%v after the kill), the client still fails to write: %v",
				time.Since(time.Unix(0, p)).Round(time.Millisecond), time.Unix(0, p).Sub(killed).Round(time.Millisecond), err)
		}
		if time.Since(killed) > time.Minute {
			t.Fatalf("the replica was not promoted within a minute of the kill; the write fails with %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wrote := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the promotion to be seen", func() bool { return promoted.Load() > 0 })
	p := time.Unix(0, promoted.Load())
	t.Logf("promoted %v after the kill; the client wrote %v after the promotion, after %d failed writes",
		p.Sub(killed).Round(time.Millisecond), wrote.Sub(p).Round(time.Millisecond), failures)
	if got := g.Replicas[0].Client.Get(ctx, key).Val(); got != "after" {
		t.Errorf("the promoted replica holds %q; want after", got)
	}
}
