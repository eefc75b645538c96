package semaphore_test

import (
	"context"
	"testing"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// Side-by-side ratios (Acquire+Release per PING, hand-off latency,
// utilisation against polling designs) come from internal/bench/semabench
// (make bench); these are the per-operation costs for go test -bench.

func BenchmarkPing(b *testing.B) {
	rdb, _ := testenv.Redis(b)
	ctx := context.Background()
	for b.Loop() {
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	rdb, prefix := testenv.Redis(b)
	s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// Contended: every goroutine competes for 4 permits, so most grants are
// hand-offs from a releaser to a queued waiter.
func BenchmarkAcquireReleaseContended(b *testing.B) {
	rdb, prefix := testenv.Redis(b)
	s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 4, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := s.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := p.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
