package mapreduce_test

import (
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// monitorLine is a line of MONITOR: the client's address, the command
// and its first argument.
var monitorLine = regexp.MustCompile(`^\S+ \[\d+ (\S+)\] "([^"]*)"(?: "([^"]*)")?(?: "([^"]*)")?`)

// command is a command a Redis server ran, as MONITOR showed it: its
// client's address, name and first two arguments.
type command struct{ client, name, arg, arg2 string }

// runWatched runs a run of 40 pages of "sum" on rdb, with a worker of its
// own, and returns every command the server at network/address ran
// meanwhile.
func runWatched(t *testing.T, rdb *redis.Client, network, address string) []command {
	t.Helper()
	prefix := testenv.Prefix(t)
	e := &env{t: t, rdb: rdb, prefix: prefix, queue: testenv.Queue(t, rdb, prefix), jobs: mapreduce.NewJobs()}
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))))
	var (
		mu   sync.Mutex
		cmds []command
	)
	stop := testenv.Monitor(t, network, address, func(line string) {
		if m := monitorLine.FindStringSubmatch(line); m != nil {
			mu.Lock()
			cmds = append(cmds, command{m[1], strings.ToUpper(m[2]), m[3], m[4]})
			mu.Unlock()
		}
	})
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "sum", sumArgs{N: 400, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 400*399/2 {
		t.Fatalf("state %s (%s), want succeeded with %d", st.State, st.Error, 400*399/2)
	}
	stop()
	return cmds
}

// Replication is asynchronous: a replica promoted in a failover may lack
// writes its primary acknowledged. Where the primary has a replica, a
// run's creation and each write that exactly-once rests on — a page's
// record, the split's total, the run's end — is followed, on the
// connection that made it, by WAIT 1 (which covers every earlier write
// of that connection), so that it returns only once a replica has it.
func TestLedgerWritesWaitForAReplicaOnTheConnectionThatMadeThem(t *testing.T) {
	t.Parallel()
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{})
	// A replica in a full resync is connected but has not the data: WAIT
	// counts it only once it is online.
	testenv.WaitFor(t, 30*time.Second, "the replica to be online", func() bool {
		info, err := g.Primary.Client.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	})
	cmds := runWatched(t, g.Primary.Client, "tcp", g.Primary.Client.Options().Addr)
	synced := mapreduce.SyncedScripts()
	writes := 0
	for i, c := range cmds {
		if c.name != "EVALSHA" || !slices.Contains(synced, c.arg) {
			continue
		}
		writes++
		next := slices.IndexFunc(cmds[i+1:], func(n command) bool { return n.client == c.client && n.name == "WAIT" })
		if next < 0 || cmds[i+1+next].arg != "1" {
			t.Fatalf("a ledger write (EVALSHA %s from %s) was not followed on its connection by WAIT 1: next WAIT %d", c.arg, c.client, next)
		}
	}
	if writes < 4 {
		t.Fatalf("saw %d ledger writes, want at least the run's creation, the records, the split's total and the run's end", writes)
	}
	// Start is alone in its trip: the very next command on its connection
	// is the WAIT, not one a later synced trip on that connection sent.
	start := slices.IndexFunc(cmds, func(c command) bool { return c.name == "EVALSHA" && c.arg == mapreduce.StartScript() })
	if start < 0 {
		t.Fatal("saw no run created by the start script")
	}
	var after command // the next command on the start's connection
	if next := slices.IndexFunc(cmds[start+1:], func(n command) bool { return n.client == cmds[start].client }); next >= 0 {
		after = cmds[start+1+next]
	}
	if after.name != "WAIT" || after.arg != "1" {
		t.Fatalf("the run's creation was followed on its connection by %+v, not WAIT 1", after)
	}
}

// A deployment without a replica pays nothing per write for it: its
// ledger writes send no WAIT. Whether there is a replica is asked once
// before the job's first synced write, then every few seconds in the
// background (WAIT 0 0, then WAIT 1 with a 50 ms bound).
func TestWithoutAReplicaLedgerWritesWaitForNone(t *testing.T) {
	t.Parallel()
	s := testenv.PrivateRedisServer(t)
	cmds := runWatched(t, s.Client, "unix", s.Socket)
	asks := 0
	for _, c := range cmds {
		switch {
		case c.name != "WAIT" || c.arg == "0":
		case c.arg == "1" && c.arg2 == "50":
			asks++
		default:
			t.Fatalf("a deployment without a replica sent WAIT %s %s", c.arg, c.arg2)
		}
	}
	if asks > 3 {
		t.Fatalf("a run of a few seconds asked for replicas %d times, want once and then every 5 s", asks)
	}
}

// A replica that stops answering (paused) mid-run holds a write up for at
// most the WAIT's bound, a second: the write is retried, and once no
// replica acknowledges a WAIT the writes stop waiting for one until a
// replica answers again. The run goes on, slower by a second or two, not
// stalled.
func TestAReplicaThatStopsAnsweringCostsARunSecondsNotTheRun(t *testing.T) {
	// Not parallel: it times a run.
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{})
	ctx := context.Background()
	info, err := g.Replica.Client.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid == 0 {
		t.Fatalf("no process_id in the replica's INFO server: %q", info)
	}
	testenv.WaitFor(t, 30*time.Second, "the replica to be online", func() bool {
		info, err := g.Primary.Client.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	})
	var waits, waitsBefore atomic.Int32 // the synced writes' WAITs
	stop := testenv.Monitor(t, "tcp", g.Primary.Client.Options().Addr, func(line string) {
		if m := monitorLine.FindStringSubmatch(line); m != nil && strings.EqualFold(m[2], "WAIT") && m[3] == "1" && m[4] == "1000" {
			waits.Add(1)
		}
	})
	defer stop()

	rdb := g.Primary.Client
	prefix := testenv.Prefix(t)
	e := &env{t: t, rdb: rdb, prefix: prefix, queue: testenv.Queue(t, rdb, prefix), jobs: mapreduce.NewJobs()}
	job := sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{}))
	// The first 20 pages taken run at once, the rest once the replica is
	// paused. (Pages are enqueued concurrently, so not in order: a gate on
	// the page's index could hold every worker on the second half while
	// pages of the first wait behind them.)
	gate := make(chan struct{})
	var (
		mu    sync.Mutex
		first = map[int]bool{}
	)
	inner := job.Map
	job.Map = func(ctx context.Context, p span) (int, error) {
		mu.Lock()
		if len(first) < 20 {
			first[p.Lo] = true
		}
		early := first[p.Lo]
		mu.Unlock()
		if !early {
			<-gate
		}
		return inner(ctx, p)
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "sum", sumArgs{N: 400, PageSize: 10}, mapreduce.StartOptions{})
	testenv.WaitFor(t, 20*time.Second, "the first half of the run to be recorded", func() bool {
		st, err := c.Status(ctx, id)
		return err == nil && st.Done >= 20
	})
	waitsBefore.Store(waits.Load())
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	paused := time.Now()
	close(gate)
	if st := wait(t, c, id, 20*time.Second); st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 400*399/2 {
		t.Fatalf("state %s (%s), want succeeded with %d", st.State, st.Error, 400*399/2)
	}
	took := time.Since(paused)
	t.Logf("the second half of the run took %v with its replica paused", took.Round(time.Millisecond))
	// Each write waiting its whole second would take 50 s here.
	if took > 15*time.Second {
		t.Errorf("the second half of the run took %v with its replica paused, want a second or two (at most 15 s on a loaded machine)", took.Round(time.Millisecond))
	}
	if waitsBefore.Load() == 0 {
		t.Errorf("no write waited for the replica before it was paused: the test proves nothing")
	}
}

// A Start whose new run no replica acknowledges (the replica paused)
// waits the WAIT's bound, a second, and then keeps the run, with a
// warning, rather than fail a Start whose run exists: a caller that
// started again would get ErrRunExists for its own run.
func TestAStartNoReplicaAcknowledgesKeepsItsRunWithAWarning(t *testing.T) {
	t.Parallel()
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{})
	ctx := context.Background()
	testenv.WaitFor(t, 30*time.Second, "the replica to be online", func() bool {
		info, err := g.Primary.Client.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	})
	rdb := g.Primary.Client
	prefix := testenv.Prefix(t)
	e := &env{t: t, rdb: rdb, prefix: prefix, queue: testenv.Queue(t, rdb, prefix), jobs: mapreduce.NewJobs()}
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{AllowOverlap: true}))))
	c, logs := e.loggedClient(slog.LevelWarn)
	mustStart(t, c, "sum", sumArgs{N: 10, PageSize: 10}, mapreduce.StartOptions{}) // the client finds the replica
	pid := g.Replica.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	began := time.Now()
	id := mustStart(t, c, "sum", sumArgs{N: 10, PageSize: 10}, mapreduce.StartOptions{})
	if took := time.Since(began); took < 900*time.Millisecond {
		t.Fatalf("Start returned after %v with the replica paused: it did not wait for the replica", took)
	}
	logs.WaitForRecord(t, 5*time.Second, "mapreduce: start: no replica acknowledged the new run in time")
	if st, err := c.Status(ctx, id); err != nil || st.State != mapreduce.StateSplitting {
		t.Fatalf("the run Start kept: %v, %v; want it splitting", st, err)
	}
}
