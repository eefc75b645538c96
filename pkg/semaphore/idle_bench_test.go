package semaphore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// BenchmarkCallsAfterIdle times single calls made after 2 ms of quiet, the
// gap a hand-off follows when permits are held for 2 ms: Redis's CPU and
// ours have gone idle, and each call runs on cold caches. Back to back, a
// release costs little more than a PING; after the gap it costs much more,
// and that difference is what a hand-off at short holds pays over the
// one-PING bound (BENCHMARKS.md, "Permit utilisation under contention").
// Each iteration makes one call of every kind, round-robin, so that the
// machine drifts under all of them alike; the medians are reported in µs, and as
// ratios to PING's.
//
//	scripts/with-servers.sh go test -run '^$' -bench CallsAfterIdle -benchtime 2000x ./pkg/semaphore
func BenchmarkCallsAfterIdle(b *testing.B) {
	b.Run("after-2ms", func(b *testing.B) { benchmarkCalls(b, 2*time.Millisecond) })
	b.Run("back-to-back", func(b *testing.B) { benchmarkCalls(b, 0) })
}

func benchmarkCalls(b *testing.B, gap time.Duration) {
	rdb, prefix := testenv.Redis(b)
	ctx := context.Background()
	s, err := New(rdb, "db", Options{Limit: 4, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	empty := redis.NewScript("return 1")
	lease := s.opts.Lease.Milliseconds()
	acquire := func(tok string) error {
		res, err := s.evalAs(ctx, s.process, scriptAcquire, tok, lease, lease, "1", "0")
		if err == nil && res.([]any)[0].(int64) < 0 {
			b.Fatalf("acquire %s: %v", tok, res)
		}
		return err
	}
	// Four holders and a queue behind them, all of this process's, as a
	// worker sees it under contention; nobody else touches them.
	var holders, queue []string
	for i := range 4 + 32 {
		tok := s.newToken(1)
		if err := acquire(tok); err != nil {
			b.Fatal(err)
		}
		if i < 4 {
			holders = append(holders, tok)
		} else {
			queue = append(queue, tok)
		}
	}
	if err := empty.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	calls := []struct {
		name string
		call func(i int) error
	}{
		{"ping", func(int) error { return rdb.Ping(ctx).Err() }},
		{"empty-script", func(int) error { return empty.EvalSha(ctx, rdb, nil).Err() }},
		{"release-nothing", func(int) error {
			_, err := s.evalAs(ctx, s.process, scriptRelease, "", lease, lease)
			return err
		}},
		// A hand-off: a holder's release grants the queue's head.
		{"release-handoff", func(i int) error {
			res, err := s.evalAs(ctx, s.process, scriptRelease, holders[i%4], lease, lease)
			if err != nil {
				return err
			}
			if vals := res.([]any); len(vals) != 5 || vals[3] != queue[0] {
				b.Fatalf("release of %s = %v, want a grant to %s", holders[i%4], vals, queue[0])
			}
			holders[i%4], queue = queue[0], queue[1:]
			return nil
		}},
		// The released worker queues again behind everyone.
		{"acquire-queued", func(int) error {
			tok := s.newToken(1)
			queue = append(queue, tok)
			return acquire(tok)
		}},
	}
	took := make([][]time.Duration, len(calls))
	for i := 0; b.Loop(); i++ {
		for k, c := range calls {
			if gap > 0 {
				time.Sleep(gap)
			}
			start := time.Now()
			if err := c.call(i); err != nil {
				b.Fatal(err)
			}
			took[k] = append(took[k], time.Since(start))
		}
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 1e3
	}
	ping := median(took[0])
	b.ReportMetric(0, "ns/op") // the sleeps: not a cost
	for k, c := range calls {
		m := median(took[k])
		b.ReportMetric(m, c.name+"-µs")
		if k > 0 {
			b.ReportMetric(m/ping, c.name+"/ping")
		}
	}
}
