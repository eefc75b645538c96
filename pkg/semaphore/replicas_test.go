//go:build unix

package semaphore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// replicaServers lets one test at a time run servers with replicas (five
// processes for a Sentinel group): started together on a small machine
// they starve the package's tests that time leases of a few hundred
// milliseconds.
var replicaServers sync.Mutex

// oneAtATime holds replicaServers until the test ends.
func oneAtATime(t *testing.T) {
	replicaServers.Lock()
	t.Cleanup(replicaServers.Unlock)
}

// sentinels starts a Sentinel group (testenv.PrivateSentinels), one test
// at a time, and returns once its primary counts the replica as online,
// as a handle's first look for replicas does: a replica still finishing
// its first sync is not counted yet.
func sentinels(t *testing.T) *testenv.SentinelGroup {
	t.Helper()
	oneAtATime(t)
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{DownAfter: time.Second}) // failOver's tests kill the primary
	replicaOnline(t, g)
	return g
}

// replicaOnline waits until g's primary counts its replica as online.
func replicaOnline(t *testing.T, g *testenv.SentinelGroup) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "the primary to count its replica", func() bool {
		n, err := g.Primary.Client.Do(context.Background(), "wait", 1, 100).Int()
		return err == nil && n == 1
	})
}

// pauseReplica stops g's replica with SIGSTOP: it stays connected to the
// primary and acknowledges nothing until the returned function resumes it.
func pauseReplica(t *testing.T, g *testenv.SentinelGroup) (resume func()) {
	t.Helper()
	pid := g.Replica.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// cutReplica pauses g's replica and has the primary drop its link to it,
// so that nothing the primary writes from now on reaches the replica (a
// paused replica would still read what its kernel had buffered). The
// returned function resumes it; it reconnects if the primary lives.
func cutReplica(t *testing.T, g *testenv.SentinelGroup) (resume func()) {
	t.Helper()
	resume = pauseReplica(t, g)
	if err := g.Primary.Client.Do(context.Background(), "client", "kill", "type", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	return resume
}

// countWaits counts, with MONITOR on server, the WAITs for one replica
// (WAIT 1 …) that clients send it.
func countWaits(t *testing.T, server *redis.Client) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	testenv.Monitor(t, server.Options().Network, server.Options().Addr, func(l string) {
		if strings.Contains(strings.ToLower(l), `"wait" "1"`) {
			n.Add(1)
		}
	})
	return &n
}

// heldOn reports whether the server of rdb (a replica, say) records token
// as a holder of the semaphore under prefix.
func heldOn(t *testing.T, rdb *redis.Client, prefix, token string) bool {
	t.Helper()
	_, err := rdb.ZScore(context.Background(), prefix+":{db}:holders", token).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return err == nil
}

// notYet fails the test if got has a permit already.
func notYet(t *testing.T, got <-chan *semaphore.Permit, what string) {
	t.Helper()
	select {
	case p := <-got:
		t.Fatalf("%s: the permit (%v) was handed over while the replica was paused", what, p)
	default:
	}
}

func receive(t *testing.T, got <-chan *semaphore.Permit) *semaphore.Permit {
	t.Helper()
	select {
	case p := <-got:
		if p == nil {
			t.Fatal("Acquire failed")
		}
		return p
	case <-time.After(20 * time.Second):
		t.Fatal("no permit within 20s of the replica's return")
	}
	return nil
}

// TestAGrantIsHandedOverOnlyOnceAReplicaHasIt pauses the primary's only
// replica and asks for a permit on each path a grant takes to its
// caller: granted at once, woken by another process's release, handed
// over by its own process's release. None returns while the replica is
// paused, its WAIT sent; each returns once it resumes, and the replica
// has the holder by then.
func TestAGrantIsHandedOverOnlyOnceAReplicaHasIt(t *testing.T) {
	t.Parallel()
	g := sentinels(t)
	// A read timeout above the WAIT's bound, which New insists on.
	rdb := redis.NewClient(&redis.Options{Addr: g.Primary.Client.Options().Addr, ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := semaphore.Options{Limit: 1, ReplicaWait: 15 * time.Second}
	waits := countWaits(t, g.Primary.Client)

	// paused runs start with the replica paused, waits until a WAIT for
	// one replica was sent since, checks that got has no permit yet,
	// resumes the replica and returns the permit.
	paused := func(t *testing.T, prefix string, start func() <-chan *semaphore.Permit) {
		t.Helper()
		resume := pauseReplica(t, g)
		before := waits.Load()
		got := start()
		testenv.WaitFor(t, 10*time.Second, "a WAIT sent while the replica is paused", func() bool { return waits.Load() > before })
		notYet(t, got, t.Name())
		resume()
		p := receive(t, got)
		if !heldOn(t, g.Replica.Client, prefix, p.ID()) {
			t.Fatalf("Acquire returned %s, which the replica does not hold", p.ID())
		}
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("granted at once", func(t *testing.T) {
		prefix := testenv.Prefix(t)
		replicaOnline(t, g) // as the new handles' first look for replicas needs
		s := newSem(t, rdb, prefix, opts)
		paused(t, prefix, func() <-chan *semaphore.Permit {
			got := make(chan *semaphore.Permit, 1)
			go func() {
				p, err := s.Acquire(context.Background())
				if err != nil {
					t.Error(err)
				}
				got <- p
			}()
			return got
		})
	})
	t.Run("woken by another process's release", func(t *testing.T) {
		prefix := testenv.Prefix(t)
		replicaOnline(t, g) // as the new handles' first look for replicas needs
		a, b, held, _ := func() (*semaphore.Semaphore, *semaphore.Semaphore, *semaphore.Permit, struct{}) {
			a := newSem(t, rdb, prefix, opts)
			return a, newSem(t, rdb, prefix, opts), mustAcquire(t, a), struct{}{}
		}()
		got := acquireQueued(t, b, a, 1)
		paused(t, prefix, func() <-chan *semaphore.Permit {
			if err := held.Release(context.Background()); err != nil {
				t.Error(err)
			}
			return got
		})
	})
	t.Run("handed over by its own process's release", func(t *testing.T) {
		prefix := testenv.Prefix(t)
		replicaOnline(t, g) // as the new handles' first look for replicas needs
		a := newSem(t, rdb, prefix, opts)
		held := mustAcquire(t, a)
		got := acquireQueued(t, a, a, 1)
		paused(t, prefix, func() <-chan *semaphore.Permit {
			go func() { _ = held.Release(context.Background()) }()
			return got
		})
	})
}

// TestAGrantNoReplicaAcknowledgesGoesOnAfterReplicaWait specifies what
// happens when no replica acknowledges a grant: an Acquire whose context
// ends first returns its error and gives the permit back; otherwise,
// once Options.ReplicaWait has passed since the grant, the permit is
// handed over with a warning, and later grants wait for no replica until
// one is in sync again.
func TestAGrantNoReplicaAcknowledgesGoesOnAfterReplicaWait(t *testing.T) {
	t.Parallel()
	g := sentinels(t)
	rdb := g.Primary.Client
	prefix := testenv.Prefix(t)
	var logs testenv.LogBuffer
	const bound = 500 * time.Millisecond
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 2, ReplicaWait: bound,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := mustAcquire(t, s).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	pauseReplica(t, g)

	ctx, cancel := context.WithTimeout(context.Background(), bound/5)
	defer cancel()
	if p, err := s.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with an unacknowledged grant and a shorter context = %v, %v; want the context's deadline", p, err)
	}
	testenv.WaitFor(t, 5*time.Second, "the grant given back", func() bool { return stats(t, s).Held == 0 })

	began := time.Now()
	p := mustAcquire(t, s)
	if took := time.Since(began); took < bound {
		t.Fatalf("an unacknowledged grant was handed over after %v, before ReplicaWait (%v)", took, bound)
	}
	logs.WaitForRecord(t, time.Second, "no replica acknowledged a write that a grant or limit rests on in time")
	began = time.Now()
	q := mustAcquire(t, s)
	if took := time.Since(began); took >= bound {
		t.Fatalf("the next grant waited %v for a replica known not to acknowledge", took)
	}
	for _, x := range []*semaphore.Permit{p, q} {
		if err := x.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWithoutReplicasNoWaitIsSent: a primary without replicas costs a
// grant nothing more than before: one call, no WAIT for a replica.
func TestWithoutReplicasNoWaitIsSent(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivateRedisServer(t)
	rdb := srv.Client
	prefix := testenv.Prefix(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 2})
	first := mustAcquire(t, s) // the handle's first call asks for replicas: WAIT 0 0
	var mu sync.Mutex
	var cmds []string
	stop := testenv.Monitor(t, "unix", srv.Socket, func(l string) {
		if strings.Contains(l, " lua] ") {
			return // a command of the script
		}
		_, args, _ := strings.Cut(l, "] ")
		name, _, _ := strings.Cut(args, " ")
		name = strings.ToLower(strings.Trim(name, `"`))
		if name == "blmpop" || name == "blpop" || name == "hello" || name == "client" {
			return // the dispatcher's wait for wake-ups; a new pooled connection's handshake
		}
		mu.Lock()
		cmds = append(cmds, name)
		mu.Unlock()
	})
	p := mustAcquire(t, s)
	// MONITOR shows commands in order: once the marker is seen, so is
	// everything the Acquire sent.
	if err := rdb.Echo(context.Background(), prefix+"-marker").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the marker seen", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(cmds) > 0 && cmds[len(cmds)-1] == "echo"
	})
	stop()
	cmds = cmds[:len(cmds)-1]
	if len(cmds) != 1 || (cmds[0] != "fcall" && cmds[0] != "evalsha") {
		t.Fatalf("an uncontended Acquire sent %q; want one script call and no WAIT", cmds)
	}
	for _, q := range []*semaphore.Permit{p, first} {
		if err := q.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOnAClusterWithoutReplicasNoWaitIsSent: on a cluster whose master
// has no replica, a grant sends no WAIT either.
func TestOnAClusterWithoutReplicasNoWaitIsSent(t *testing.T) {
	t.Parallel()
	node := testenv.PrivateRedisCluster(t, nil)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{node.Client.Options().Addr}})
	t.Cleanup(func() { _ = cc.Close() })
	waits := countWaits(t, node.Client)
	prefix := testenv.Prefix(t)
	a := newSem(t, cc, prefix, semaphore.Options{Limit: 1})
	b := newSem(t, cc, prefix, semaphore.Options{Limit: 1})
	p := mustAcquire(t, a)
	got := acquireQueued(t, b, a, 1)
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, got).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := waits.Load(); n != 0 {
		t.Fatalf("%d WAITs for a replica sent to a cluster without replicas", n)
	}
}

// failoverClient is a client of g through its Sentinels, as a worker's.
func failoverClient(t *testing.T, g *testenv.SentinelGroup) *redis.Client {
	t.Helper()
	var addrs []string
	for _, s := range g.Sentinels {
		addrs = append(addrs, s.Client.Options().Addr)
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMaster, SentinelAddrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// failOver kills g's primary with SIGKILL, resumes its replica (resume,
// if not nil) and waits until the Sentinels have promoted it.
func failOver(t *testing.T, g *testenv.SentinelGroup, resume func()) {
	t.Helper()
	g.Primary.Kill()
	if resume != nil {
		resume()
	}
	testenv.WaitFor(t, 60*time.Second, "the replica promoted", func() bool {
		role, err := g.Replica.Client.Do(context.Background(), "role").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	})
}

// TestAFailoverToAReplicaThatMissedTheGrantsGrantsNoPermitTwice: the
// primary records grants up to the limit that its replica, cut off, never
// receives, and dies (kill -9) before ReplicaWait has passed; the
// Sentinels promote the replica. No
// permit is held twice: every permit the Acquire calls returned is one
// the new primary counts, it counts no more than the limit, and another
// process finds no free permit.
func TestAFailoverToAReplicaThatMissedTheGrantsGrantsNoPermitTwice(t *testing.T) {
	t.Parallel()
	const limit = 3
	g := sentinels(t)
	rdb := failoverClient(t, g)
	prefix := testenv.Prefix(t)
	opts := semaphore.Options{Limit: limit, ReplicaWait: 2 * time.Second}
	s := newSem(t, rdb, prefix, opts)
	waits := countWaits(t, g.Primary.Client)
	if err := mustAcquire(t, s).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the first grant's WAIT (the handle found the replica)", func() bool { return waits.Load() > 0 })
	resume := cutReplica(t, g)
	got := make(chan *semaphore.Permit, limit)
	for range limit {
		go func() {
			p, err := s.Acquire(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- p
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "the primary to record every grant", func() bool { return stats(t, s).Held == limit })
	failOver(t, g, resume)

	ids := map[string]bool{}
	for range limit {
		ids[receive(t, got).ID()] = true
	}
	other := newSem(t, failoverClient(t, g), prefix, opts)
	if p, err := other.TryAcquire(context.Background()); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("after the failover another process's TryAcquire = %v, %v; want ErrNoPermit: a permit is held twice", p, err)
	}
	st := stats(t, other)
	if st.Held > limit {
		t.Fatalf("the new primary counts %d held, above the limit %d", st.Held, limit)
	}
	for id := range ids {
		if !heldOn(t, g.Replica.Client, prefix, id) {
			t.Fatalf("Acquire returned %s, which the new primary does not count: %+v", id, st.Holders)
		}
	}
}

// TestAHolderWhoseGrantAFailoverLostIsToldAtItsNextRefresh: with WAIT
// turned off (ReplicaWait < 0), a grant the replica never received (the
// replica is stopped and its link cut before the Acquire) is lost when
// the primary dies: the promoted replica does not know the token. Its
// holder learns it from its next refresh (S4), not from its own lease
// running out: its Permit's context is cancelled with ErrLeaseLost within
// Lease/3 and a few retries of the promotion, the log says Redis no
// longer holds the permit, and Release says so. The permit is not lost to
// the fleet: another process's Acquire on the new primary gets it.
func TestAHolderWhoseGrantAFailoverLostIsToldAtItsNextRefresh(t *testing.T) {
	t.Parallel()
	g := sentinels(t)
	rdb := failoverClient(t, g)
	prefix := testenv.Prefix(t)
	// A lease long enough that the holder's own deadline (Lease less a
	// tenth) cannot cancel it before a refresh reaches the new primary.
	const lease = 15 * time.Second
	var logs testenv.LogBuffer
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease, ReplicaWait: -1,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := mustAcquire(t, s).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	resume := cutReplica(t, g)
	p := mustAcquire(t, s) // returns at once: nothing waits for the replica
	killed := time.Now()
	failOver(t, g, resume)
	promoted := time.Now()
	if heldOn(t, g.Replica.Client, prefix, p.ID()) {
		t.Fatalf("the promoted replica holds %s: the test did not keep the grant from it", p.ID())
	}
	select {
	case <-p.Context().Done():
	case <-time.After(lease/3 + 10*time.Second):
		t.Fatalf("the holder of a grant the failover lost was not told within Lease/3 (%v) and 10s of the promotion", lease/3)
	}
	t.Logf("told %v after the kill, %v after the promotion (Lease/3 = %v)", time.Since(killed).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond), lease/3)
	if cause := context.Cause(p.Context()); !errors.Is(cause, semaphore.ErrLeaseLost) {
		t.Fatalf("cause %v; want ErrLeaseLost", cause)
	}
	if !strings.Contains(logs.String(), "lease lost: Redis no longer holds the permit") {
		t.Fatalf("the holder was not told by a refresh that Redis lacks its permit; logs:\n%s", logs.Tail(10))
	}
	if err := p.Release(context.Background()); !errors.Is(err, semaphore.ErrLeaseLost) {
		t.Fatalf("Release = %v; want ErrLeaseLost", err)
	}
	other := newSem(t, failoverClient(t, g), prefix, semaphore.Options{Limit: 1, Lease: lease, ReplicaWait: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := other.Acquire(ctx)
	if err != nil {
		t.Fatalf("another process's Acquire after the failover = %v; want the permit the failover lost", err)
	}
	if err := q.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestAHolderWhoseGrantAReplicaHadKeepsItThroughAFailover: with WAIT on
// (the default ReplicaWait), the grant is on the replica when Acquire
// returns, so a failover (kill -9 of the primary) does not take it: the
// promoted replica knows the token, the holder's refreshes go on
// extending its lease there, its context is not cancelled, and Release
// gives the permit back.
func TestAHolderWhoseGrantAReplicaHadKeepsItThroughAFailover(t *testing.T) {
	t.Parallel()
	g := sentinels(t)
	rdb := failoverClient(t, g)
	prefix := testenv.Prefix(t)
	const lease = 15 * time.Second
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: lease})
	p := mustAcquire(t, s)
	failOver(t, g, nil)
	promoted := time.Now()
	key := prefix + ":{db}:holders"
	first, err := g.Replica.Client.ZScore(context.Background(), key, p.ID()).Result()
	if err != nil {
		t.Fatalf("the promoted replica does not know the holder %s: %v", p.ID(), err)
	}
	testenv.WaitFor(t, lease/3+10*time.Second, "a refresh on the new primary extending the lease", func() bool {
		d, err := g.Replica.Client.ZScore(context.Background(), key, p.ID()).Result()
		return err == nil && d > first
	})
	t.Logf("lease refreshed on the new primary %v after the promotion", time.Since(promoted).Round(time.Millisecond))
	if err := context.Cause(p.Context()); err != nil {
		t.Fatalf("the holder's context ended (%v) though the new primary holds its permit", err)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release after the failover = %v; want nil", err)
	}
	if st := stats(t, s); st.Held != 0 {
		t.Fatalf("after Release the new primary counts %d held; want 0", st.Held)
	}
}

// TestOnAClusterAGrantWaitsForTheReplicaOfItsSlotsMaster: on a cluster
// whose master has a replica, the WAIT goes to the master that holds the
// semaphore's slot, and a grant returns only once the replica has it.
func TestOnAClusterAGrantWaitsForTheReplicaOfItsSlotsMaster(t *testing.T) {
	t.Parallel()
	oneAtATime(t)
	node := testenv.PrivateRedisCluster(t, nil)
	replica := testenv.PrivateRedisClusterReplica(t, node)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{node.Client.Options().Addr}, ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	waits := countWaits(t, node.Client)
	prefix := testenv.Prefix(t)
	s := newSem(t, cc, prefix, semaphore.Options{Limit: 1, ReplicaWait: 15 * time.Second})
	if err := mustAcquire(t, s).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the first grant's WAIT on the master", func() bool { return waits.Load() > 0 })

	pid := replica.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume := func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	before := waits.Load()
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := s.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	testenv.WaitFor(t, 10*time.Second, "a WAIT on the master while its replica is paused", func() bool { return waits.Load() > before })
	notYet(t, got, "cluster")
	resume()
	p := receive(t, got)
	// A cluster replica answers reads only on a connection that said READONLY.
	ro := redis.NewClient(&redis.Options{Addr: replica.Client.Options().Addr, PoolSize: 1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	t.Cleanup(func() { _ = ro.Close() })
	if !heldOn(t, ro, prefix, p.ID()) {
		t.Fatalf("Acquire returned %s, which the cluster replica does not hold", p.ID())
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSetLimitReturnsOnceAReplicaHasTheLimit: with the replica paused,
// SetLimit does not return; once it resumes, SetLimit returns and the
// replica has the new limit.
func TestSetLimitReturnsOnceAReplicaHasTheLimit(t *testing.T) {
	t.Parallel()
	g := sentinels(t)
	rdb := redis.NewClient(&redis.Options{Addr: g.Primary.Client.Options().Addr, ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	waits := countWaits(t, g.Primary.Client)
	prefix := testenv.Prefix(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, ReplicaWait: 15 * time.Second})
	if err := mustAcquire(t, s).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	resume := pauseReplica(t, g)
	before := waits.Load()
	done := make(chan error, 1)
	go func() { done <- s.SetLimit(context.Background(), 7) }()
	testenv.WaitFor(t, 10*time.Second, "a WAIT sent while the replica is paused", func() bool { return waits.Load() > before })
	select {
	case err := <-done:
		t.Fatalf("SetLimit returned (%v) while the replica was paused", err)
	default:
	}
	resume()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SetLimit did not return once the replica resumed")
	}
	if v, err := g.Replica.Client.Get(context.Background(), prefix+":{db}:limit").Result(); err != nil || v != "7" {
		t.Fatalf("the replica's limit is %q (%v); want 7", v, err)
	}
}
