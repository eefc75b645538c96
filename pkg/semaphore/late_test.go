package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// argRetry is the acquire script's retry flag (ARGV[9]) in a call's
// arguments.
const argRetry = 3 + 8 + 8

// lateCall is a hook that holds back the first acquire call of a waiter
// (a first attempt: its retry flag is "0"), failing it as a timed-out read
// would, as if the request had left but its reply had not come back, and
// keeps its arguments so that the test can make it land later.
type lateCall struct {
	mu       sync.Mutex
	args     []any         // the held call's, once held
	token    string        // its token
	gaveBack chan struct{} // closed once a release of token has returned
}

func (h *lateCall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd, semaphore.AcquireScript) && arg(cmd, argWaitFlag) == "1" && arg(cmd, argRetry) == "0" {
			h.mu.Lock()
			first := h.args == nil
			if first {
				h.args, h.token = cmd.Args(), arg(cmd, argToken)
			}
			h.mu.Unlock()
			if first {
				err := errors.New("read tcp 127.0.0.1:6379: i/o timeout (injected: the request is on its way)")
				cmd.SetErr(err)
				return err
			}
		}
		err := next(ctx, cmd)
		if err == nil && (isScript(cmd, semaphore.ReleaseScript) || isScript(cmd, semaphore.CarryScript)) {
			h.mu.Lock()
			if h.token != "" && arg(cmd, argToken) == h.token {
				select {
				case <-h.gaveBack:
				default:
					close(h.gaveBack)
				}
			}
			h.mu.Unlock()
		}
		return err
	}
}
func (h *lateCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// land makes the held call reach Redis now, over rdb, once its token was
// given back.
func (h *lateCall) land(t *testing.T, rdb *redis.Client) any {
	t.Helper()
	select {
	case <-h.gaveBack:
	case <-time.After(5 * time.Second):
		t.Fatal("the held call's token was not given back")
	}
	h.mu.Lock()
	args := h.args
	h.mu.Unlock()
	if args == nil {
		t.Fatal("no acquire call was held")
	}
	res, err := rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("landing the held acquire call: %v", err)
	}
	return res
}

// lateScene is a handle a whose first acquire call is held back, on a
// semaphore of one permit, and a handle of its own on the same semaphore.
func lateScene(t *testing.T) (a, other *semaphore.Semaphore, h *lateCall, rdb *redis.Client) {
	t.Helper()
	h = &lateCall{gaveBack: make(chan struct{})}
	rdb, prefix := testenv.Redis(t)
	hooked := redis.NewClient(rdb.Options())
	hooked.AddHook(h)
	t.Cleanup(func() { _ = hooked.Close() })
	// A lease far longer than the test: what gives a stray permit back here
	// is not its lease running out.
	a = newSem(t, hooked, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	other = newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	return a, other, h, rdb
}

// freeWithin fails t unless the semaphore has no holder and no waiter
// within d.
func freeWithin(t *testing.T, other *semaphore.Semaphore, d time.Duration, what string) {
	t.Helper()
	var st semaphore.Stats
	deadline := time.Now().Add(d)
	for {
		st = stats(t, other)
		if st.Held == 0 && len(st.Waiters) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v later the semaphore is still taken, by nobody that uses it: %+v", what, d, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A waiter's first acquire call times out while on its way, so it retries:
// Redis does not know the token, and the waiter queues under a new one
// and gives the old one back, which finds nothing. Then the first call
// lands, and queues the old token; a release grants it later. That grant
// reaches a's dispatcher for a token nobody waits for: it must go back at
// once, not stay taken for a lease.
func TestAQueuedAcquireCallThatLandsAfterItWasGivenUpIsGivenBackWhenGranted(t *testing.T) {
	t.Parallel()
	a, other, h, rdb := lateScene(t)
	ctx := context.Background()
	held := mustAcquire(t, other)
	got := acquireQueued(t, a, other, 1) // the retry, under a new token
	if res, ok := h.land(t, rdb).([]any); !ok || len(res) != 3 || res[0] != int64(0) {
		t.Fatalf("the late call did not queue its token: %v", res)
	}
	if n := len(stats(t, other).Waiters); n != 2 {
		t.Fatalf("want a's place and the late call's queued, got %d waiters", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p := receiveGrant(t, got, 5*time.Second, "a's place, ahead of the late call's")
	if err := p.Release(ctx); err != nil { // grants the late call's place
		t.Fatal(err)
	}
	freeWithin(t, other, 2*time.Second, "the late call's place was granted")
	mustAcquire(t, other)
}

// As above, but the first call lands while the permit is free, and is
// granted it outright: no wake-up tells a's process. It must still go
// back within moments, not after a lease.
func TestAnAcquireCallThatLandsAfterItWasGivenUpAndIsGrantedAtOnceIsGivenBack(t *testing.T) {
	t.Parallel()
	a, other, h, rdb := lateScene(t)
	ctx := context.Background()
	p := mustAcquire(t, a) // the retry, under a new token
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if res, ok := h.land(t, rdb).([]any); !ok || len(res) != 3 || res[0] != int64(1) {
		t.Fatalf("the late call was not granted the free permit: %v", res)
	}
	freeWithin(t, other, 3*time.Second, "the late call was granted the free permit")
	mustAcquire(t, other)
}
