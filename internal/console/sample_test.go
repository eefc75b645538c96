package console_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// While Redis is away the sampler fails every SampleEvery (a second by
// default); it warns when that starts and once a minute after, not each
// time, and says when sampling works again.
func TestTheSamplerWarnsOnceWhenRedisGoesAwayAndSaysWhenItIsBack(t *testing.T) {
	t.Parallel()
	_, prefix := testenv.Redis(t)
	proxy, proxied := testenv.RedisProxy(t, testenv.RedisURL(t))
	opts, err := redis.ParseURL(proxied)
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	con, err := console.New(console.Config{Redis: rdb, MapReduce: mr, Prefix: prefix, SemaphorePrefix: prefix + ":sem",
		SampleEvery: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() { con.Sample(ctx); close(sampled) }()
	t.Cleanup(func() { cancel(); <-sampled; _ = con.Close() })

	proxy.Cut()
	time.Sleep(2 * time.Second) // dozens of failed samples
	proxy.Restore()
	testenv.WaitFor(t, 5*time.Second, "the sampler to say it works again", func() bool {
		return bytes.Contains(logs.Bytes(), []byte("sampling semaphores works again"))
	})
	if n := bytes.Count(logs.Bytes(), []byte("level=WARN")); n != 1 {
		t.Errorf("%d warnings over 2s of failed samples, want 1:\n%s", n, logs.Bytes())
	}
}
