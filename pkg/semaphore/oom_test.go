package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// outOfMemory puts Redis over its memory limit (maxmemory below what it
// uses, nothing evictable) and returns a function that lifts the limit.
func outOfMemory(t *testing.T, rdb *redis.Client) (free func()) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET over maxmemory = %v, want Redis to refuse it with OOM", err)
	}
	return func() {
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Over maxmemory with noeviction, Redis refuses a function that may write
// unless it is flagged allow-oom, and refuses a script's first write that
// may grow memory. A release must still go through (the holder leaves) and
// still hand the permit to the waiter queued before memory ran out; Stats
// must still answer; a new Acquire must fail at once with Redis's OOM
// error, not hang or retry.
func TestOutOfMemoryReleaseStillHandsOverAndAcquireFailsClearly(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.PrivateRedis(t, "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	a, _, p, got := heldAndQueued(t, rdb, "oom", semaphore.Options{Limit: 1})

	free := outOfMemory(t, rdb)
	if a.UsesFunctions() {
		// Redis refuses a function that may grow memory, and runs the ones
		// flagged allow-oom: called here directly, on keys of their own, so
		// that no fallback can hide a missing flag.
		call := func(fn string, args ...any) error {
			k := "oomprobe:{x}:"
			cmd := []any{"FCALL", fn, numKeys, k + "limit", k + "holders", k + "queue", k + "alive", k + "info", k + "fence", k + "ticket", k + "held", k + "auto", k + "signals", k + "control",
				k + "wake:", 1, 60000, ""}
			return rdb.Do(ctx, append(cmd, args...)...).Err()
		}
		if err := call(semaphore.AcquireScript.Function, "p:1:1", 1000, 1000, "1"); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
			t.Errorf("FCALL acquire under maxmemory = %v, want Redis to refuse it with OOM", err)
		}
		// A release that carries a new waiter takes a new place too.
		if err := call(semaphore.CarryScript.Function, "p:1:1", 1000, 1000, "0", "", "p:2:1"); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
			t.Errorf("FCALL carry under maxmemory = %v, want Redis to refuse it with OOM", err)
		}
		for _, fn := range []struct {
			name string
			args []any
		}{{semaphore.ReleaseScript.Function, []any{"p:1:1"}}, {semaphore.RefreshScript.Function, []any{1000, 1000, "p:1:1"}}, {semaphore.StatsScript.Function, nil}} {
			if err := call(fn.name, fn.args...); err != nil {
				t.Errorf("FCALL %s under maxmemory = %v, want it to run (allow-oom)", fn.name, err)
			}
		}
	}

	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release under maxmemory = %v, want nil", err)
	}
	q := receiveGrant(t, got, 10*time.Second, "the waiter queued before memory ran out")
	if q.Fence() <= p.Fence() {
		t.Errorf("fence after the hand-off = %d, want > %d", q.Fence(), p.Fence())
	}

	if st, err := a.Stats(ctx); err != nil || len(st.Holders) != 1 {
		t.Errorf("Stats under maxmemory = %+v, %v; want one holder", st, err)
	}
	// Full, so TryAcquire writes nothing and answers as usual.
	if _, err := a.TryAcquire(ctx); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Errorf("TryAcquire while full under maxmemory = %v, want ErrNoPermit", err)
	}
	if err := q.Release(ctx); err != nil {
		t.Fatalf("second Release under maxmemory = %v, want nil", err)
	}
	// Free, so taking the permit needs memory Redis will not give.
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := a.Acquire(actx)
	if err == nil || !strings.Contains(err.Error(), "OOM") || !strings.Contains(err.Error(), "raise maxmemory") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire under maxmemory = %v, want Redis's OOM error at once, with what to do", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Acquire under maxmemory took %v to fail, want at once", d)
	}

	free()
	r, err := a.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after memory was freed = %v", err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Refreshing a lease grows no memory, so a Redis over its maxmemory must not
// cost holders their permits (and their queries): leases and heartbeats are
// kept for several lease times, and the permits are then released and handed
// over as usual.
func TestOutOfMemoryHoldersAndWaitersKeepTheirPlaces(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.PrivateRedis(t, "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	a, _, p, got := heldAndQueued(t, rdb, "oom", semaphore.Options{Limit: 1, Lease: lease})

	waiter := stats(t, a).Waiters[0].ID
	free := outOfMemory(t, rdb)
	defer free()
	// Refreshed under maxmemory until the lease and the heartbeat reach
	// several leases past where they stood when memory ran out.
	const leases = 3
	held, alive := deadlineMs(rdb, "oom", "holders", p.ID()), deadlineMs(rdb, "oom", "alive", waiter)
	testenv.WaitFor(t, 10*time.Second, "the lease and the heartbeat refreshed over maxmemory", func() bool {
		return deadlineMs(rdb, "oom", "holders", p.ID()) > held+float64((leases*lease).Milliseconds()) &&
			deadlineMs(rdb, "oom", "alive", waiter) > alive+float64((leases*lease).Milliseconds())
	})
	if err := context.Cause(p.Context()); err != nil {
		t.Fatalf("the holder's permit was lost while Redis was over maxmemory: %v", err)
	}
	st, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Holders[0].ID != p.ID() || len(st.Waiters) != 1 || st.Waiters[0].ID != waiter {
		t.Fatalf("after %d leases over maxmemory: holders %v, waiters %v; want the holder and the waiter kept", leases, st.Holders, st.Waiters)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release after %d leases over maxmemory = %v", leases, err)
	}
	q := receiveGrant(t, got, 10*time.Second, "the waiter, after the release")
	_ = q.Release(ctx)
}

// Over maxmemory, the call that would carry a new waiter is refused: the
// waiter hears Redis's OOM error at once, as from an acquire call of its
// own, and the releases around it go through and hand over as usual.
func TestOutOfMemoryACarriedWaiterFailsClearlyAndTheReleaseGoesThrough(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.PrivateRedis(t, "--maxmemory-policy", "noeviction")
	c := newCarrySceneOn(t, rdb, "oomcarry", semaphore.Options{Limit: 1})
	got1, released := c.oneQueuedBehindARelease(t)
	got2 := c.acquirePending(t, context.Background(), 1)
	free := outOfMemory(t, rdb)
	defer free()
	start := time.Now()
	c.open()
	if err := <-released; err != nil {
		t.Fatalf("Release under maxmemory = %v, want nil", err)
	}
	q := receiveGrant(t, got1, 10*time.Second, "the waiter queued before memory ran out")
	select {
	case r := <-got2:
		if r.err == nil || !strings.Contains(r.err.Error(), "OOM") || !strings.Contains(r.err.Error(), "raise maxmemory") {
			t.Fatalf("the carried Acquire under maxmemory = %v, %v; want Redis's OOM error, with what to do", r.p, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the carried Acquire under maxmemory did not fail")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the carried Acquire took %v to fail under maxmemory, want at once", d)
	}
	if err := q.Release(context.Background()); err != nil {
		t.Fatalf("Release under maxmemory = %v, want nil", err)
	}
	expectEmpty(t, c.obs, "after the last release under maxmemory")
}
