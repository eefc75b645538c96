package mapreduce_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/testenv"
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
// writes its primary acknowledged. Where the primary has a replica, each
// write that exactly-once rests on — a page's record, the split's total,
// the run's end — is followed, on the connection that made it, by WAIT 1
// (which covers every earlier write of that connection), so that it
// returns only once a replica has it.
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
	if writes < 3 {
		t.Fatalf("saw %d ledger writes, want at least the records, the split's total and the run's end", writes)
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
