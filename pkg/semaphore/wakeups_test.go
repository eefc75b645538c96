package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// Grants pushed to a process's wake list together are taken by one pop,
// not one round trip each: a raised limit grants three waiters of another
// process in one script, and that process's dispatcher takes all three
// with the BLMPOP it was blocked in. (A private server: its commandstats
// count the dispatchers' pops, which no client hook sees.)
func TestOnePopTakesEveryWakeUpWaiting(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.PrivateRedis(t)
	started := time.Now()
	// Long leases: no watchdog refresh, which would report the grants too,
	// may stand in for a wake-up the dispatcher failed to deliver.
	a := newSem(t, rdb, "pop", semaphore.Options{Limit: 1, Lease: time.Minute})
	b := newSem(t, rdb, "pop", semaphore.Options{Limit: 1, Lease: time.Minute})
	p := mustAcquire(t, a)
	var got []<-chan *semaphore.Permit
	for i := 1; i <= 3; i++ {
		got = append(got, acquireQueued(t, b, a, i))
	}
	// A blocked pop is counted when it is served or times out, so this
	// counts neither dispatcher's pop in progress.
	before := commandCalls(t, rdb, "blmpop")

	if err := a.SetLimit(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	for i, ch := range got {
		q := receiveGrant(t, ch, 2*time.Second, "a waiter granted by the raised limit")
		if q == nil {
			t.Fatalf("waiter %d was not granted", i+1)
		}
		defer q.Release(context.Background())
	}
	// Had the dispatcher taken one grant per pop, it would have needed
	// three pops, each served before its grant arrived here. The server
	// counts a served pop a moment after its reply: wait for the count of
	// the first, which is by then that of any pop before the last.
	var n int64
	testenv.WaitFor(t, 5*time.Second, "the pop that served the grants counted", func() bool {
		n = commandCalls(t, rdb, "blmpop") - before
		return n > 0
	})
	if elapsed := time.Since(started); elapsed >= 5*time.Second && n > 1 {
		// A dispatcher's pop blocks 5s: one may have timed out in the
		// window, and a timeout counts as a call.
		t.Skipf("%d BLMPOP calls, but the test took %v, longer than a pop blocks: timeouts may count among them", n, elapsed)
	}
	if n != 1 {
		t.Errorf("%d BLMPOP calls served for three grants pushed at once, want 1", n)
	}
	if n := commandCalls(t, rdb, "blpop"); n != 0 {
		t.Errorf("%d BLPOP calls on a server with BLMPOP", n)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Where the server has no BLMPOP (Redis 6 answers "unknown command") or the
// ACL forbids it (NOPERM), the dispatcher waits with BLPOP instead, after
// one refused BLMPOP, and hand-offs between processes work as before.
func TestWakeUpsArriveByBLPOPWhereBLMPOPIsMissingOrForbidden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string // the private server's
		acl  bool     // both handles connect as a user denied BLMPOP
	}{
		{"renamed away, as on Redis 6", []string{"--rename-command", "BLMPOP", ""}, false},
		{"forbidden by the ACL", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.PrivateRedisServer(t, tc.args...)
			client := srv.Client
			if tc.acl {
				ctx := context.Background()
				if err := srv.Client.Do(ctx, "ACL", "SETUSER", "noblmpop", "on", ">pw", "~*", "&*", "+@all", "-blmpop").Err(); err != nil {
					t.Fatal(err)
				}
				opt, _ := redis.ParseURL(srv.URL)
				opt.Username, opt.Password = "noblmpop", "pw"
				client = redis.NewClient(opt)
				t.Cleanup(func() { _ = client.Close() })
			}
			a := newSem(t, client, "wake", semaphore.Options{Limit: 1})
			b := newSem(t, client, "wake", semaphore.Options{Limit: 1})
			ctx := context.Background()
			for round := 1; round <= 2; round++ {
				p := mustAcquire(t, a)
				got := acquireQueued(t, b, a, 1)
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
				q := receiveGrant(t, got, 10*time.Second, "the other process's waiter, woken by BLPOP")
				if q == nil {
					t.Fatalf("round %d: no grant", round)
				}
				if err := q.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := commandCalls(t, srv.Client, "blpop"); n < 2 {
				t.Errorf("%d BLPOP calls served for two wake-ups, want at least 2", n)
			}
			if n := commandCalls(t, srv.Client, "blmpop"); n != 0 {
				t.Errorf("%d BLMPOP calls served, want none", n)
			}
			if tc.acl {
				if n := commandStat(t, srv.Client, "blmpop").Rejected; n != 2 {
					t.Errorf("%d BLMPOP calls refused, want 2: one per handle, which then stops asking", n)
				}
			}
		})
	}
}

// commandCalls is the number of calls of cmd the server has run.
func commandCalls(t *testing.T, rdb *redis.Client, cmd string) int64 {
	t.Helper()
	return commandStat(t, rdb, cmd).Calls
}

// commandStat is cmd's line of INFO commandstats (zero if the server has
// not seen cmd).
func commandStat(t *testing.T, rdb *redis.Client, cmd string) benchutil.CommandStat {
	t.Helper()
	stats, err := benchutil.CommandStats(context.Background(), rdb)
	if err != nil {
		t.Fatal(err)
	}
	return stats[cmd]
}
