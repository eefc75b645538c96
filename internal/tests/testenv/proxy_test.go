package testenv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// A proxy in front of a Redis on a unix socket forwards, fails every call
// at once while cut, holds every call while blackholed (the client times
// out), and forwards again after each Restore, to the same server with its
// data.
func TestProxyCutsBlackholesAndRestoresARedisOnAUnixSocket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.PrivateRedisServer(t)
	p, url := testenv.RedisProxy(t, srv.URL)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout, opt.DialTimeout, opt.MaxRetries = 300*time.Millisecond, 300*time.Millisecond, -1
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.Cut()
	var timeout interface{ Timeout() bool }
	if err := rdb.Get(ctx, "k").Err(); err == nil || errors.As(err, &timeout) && timeout.Timeout() {
		t.Errorf("a call while cut: %v, want it refused, not timed out", err)
	}
	if err := srv.Client.Get(ctx, "k").Err(); err != nil {
		t.Errorf("a client that does not go through the proxy lost the server: %v", err)
	}
	p.Restore()
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Errorf("after Restore from a cut: %q, %v; want v", v, err)
	}

	p.Blackhole()
	began := time.Now()
	err = rdb.Get(ctx, "k").Err()
	if !errors.As(err, &timeout) || !timeout.Timeout() || time.Since(began) < 250*time.Millisecond {
		t.Errorf("a call while blackholed: %v after %v, want a timeout after the client's 300ms", err, time.Since(began))
	}
	p.Restore()
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Errorf("after Restore from a blackhole: %q, %v; want v", v, err)
	}
}

// What a client sends into a blackhole arrives once it is restored, as
// TCP delivers it when a network heals.
func TestProxyDeliversWhatWasSentIntoABlackholeOnRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.PrivateRedisServer(t)
	p, url := testenv.RedisProxy(t, srv.URL)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout = 10 * time.Second
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	done := make(chan error, 1)
	go func() { done <- rdb.Set(ctx, "sent", "during", 0).Err() }()
	testenv.WaitFor(t, 5*time.Second, "the blackhole to hold the call", func() bool { return p.Held() > 0 })
	if n := srv.Client.Exists(ctx, "sent").Val(); n != 0 {
		t.Fatal("the blackhole forwarded a call")
	}
	p.Restore()
	if err := <-done; err != nil {
		t.Errorf("a call held by the blackhole: %v, want it answered after Restore", err)
	}
	if v := srv.Client.Get(ctx, "sent").Val(); v != "during" {
		t.Errorf("the server has %q, want the value sent into the blackhole", v)
	}
}
