package console_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// While Redis is away the sampler fails every SampleEvery (a second by
// default); it warns when that starts and once a minute after, not each
// time, and says when sampling works again. A Redis that refuses
// connections fails a sample at once; one that hangs (a dead host, a
// blackhole), only past the sample's own deadline, and that is a failure
// too, not a sample that worked.
func TestTheSamplerWarnsOnceWhenRedisGoesAwayAndSaysWhenItIsBack(t *testing.T) {
	t.Parallel()
	for _, away := range []string{"refusing", "hanging"} {
		t.Run(away, func(t *testing.T) {
			t.Parallel()
			proxy, logs, failed := sampledThroughProxy(t)
			if away == "refusing" {
				proxy.Cut()
			} else {
				proxy.Blackhole()
			}
			testenv.WaitFor(t, 10*time.Second, "the sampler to warn", func() bool {
				return bytes.Contains(logs.Bytes(), []byte("level=WARN"))
			})
			// Another failed sample, which must not warn again: at once
			// when refused, seconds later when hanging.
			after := failed.Load()
			testenv.WaitFor(t, 15*time.Second, "another failed call of the sampler", func() bool { return failed.Load() > after })
			proxy.Restore()
			testenv.WaitFor(t, 10*time.Second, "the sampler to say it works again", func() bool {
				return bytes.Contains(logs.Bytes(), []byte("sampling semaphores works again"))
			})
			if n := bytes.Count(logs.Bytes(), []byte("level=WARN")); n != 1 {
				t.Errorf("%d warnings while Redis was %s, want 1:\n%s", n, away, logs.Bytes())
			}
		})
	}
}

// sampledThroughProxy starts a console that samples every 50ms through a
// proxy of the test Redis, logging to the buffer it returns, with the
// count of its Redis calls that failed.
func sampledThroughProxy(t *testing.T) (*testenv.Proxy, *testenv.LogBuffer, *atomic.Int64) {
	t.Helper()
	_, prefix := testenv.Redis(t)
	proxy, proxied := testenv.RedisProxy(t, testenv.RedisURL(t))
	opts, err := redis.ParseURL(proxied)
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	failed := &failedCalls{}
	rdb.AddHook(failed)
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.LogBuffer{}
	con, err := console.New(console.Config{Redis: rdb, MapReduce: mr, Prefix: prefix, SemaphorePrefix: prefix + ":sem",
		SampleEvery: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() { con.Sample(ctx); close(sampled) }()
	t.Cleanup(func() { cancel(); <-sampled; _ = con.Close() })
	return proxy, logs, &failed.n
}

// failedCalls is a go-redis hook that counts the calls that failed
// (redis.Nil is an answer, not a failure).
type failedCalls struct{ n atomic.Int64 }

func (f *failedCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failedCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			f.n.Add(1)
		}
		return err
	}
}

func (f *failedCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil && !errors.Is(err, redis.Nil) {
			f.n.Add(1)
		}
		return err
	}
}
