package mapreduce_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// countingConn counts the bytes a client reads from Redis.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// byteCountingClient returns a mapreduce client, of no job, on a Redis client
// of its own whose reads are counted in n.
func (e *env) byteCountingClient(n *atomic.Int64) *mapreduce.Client {
	e.t.Helper()
	opt := *e.rdb.Options()
	var d net.Dialer
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{conn, n}, nil
	}
	rdb := redis.NewClient(&opt)
	e.t.Cleanup(func() { rdb.Close() })
	c, err := mapreduce.New(rdb, mapreduce.Config{Prefix: e.prefix})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// monitorReads records the commands on e's keys until stop is called
// (testenv.MonitorCommands).
func (e *env) monitorReads() (stop func() [][]string) {
	e.t.Helper()
	return testenv.MonitorCommands(e.t, e.rdb, e.prefix+":")
}

// Listing, counting and polling runs read their summaries: a run with
// 1 MiB of arguments and of result costs them a few hundred bytes, and no
// command they send reads either value (no HGETALL of a run, no HGET or
// HMGET of "args" or "result"). Status still reads a run whole.
func TestListingAndPollingRunsReadNoArgumentsOrResults(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	big := strings.Repeat("a", 1<<20-2) // 1 MiB encoded, the default MaxArgsBytes
	done := textJob("done", e.opts(mapreduce.JobOptions{}), func(args string) string { return args })
	idleQueue := e.queue + "-idle" // served by no worker: its run stays active
	testenv.RemoveQueue(t, e.rdb, idleQueue)
	idle := textJob("idle", mapreduce.JobOptions{Queue: idleQueue}, func(string) string { return "" })
	e.addJob(mapreduce.AddJob(e.jobs, done)) // idle is started, never hosted
	c := e.client()
	e.worker(c, 2)
	doneID, err := done.Start(ctx, c, big, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := wait(t, c, doneID, 30*time.Second); st.State != mapreduce.StateSucceeded || len(st.Result) != 1<<20 {
		t.Fatalf("the run %s with a %d-byte result, want succeeded with 1 MiB", st.State, len(st.Result))
	}
	idleID, err := idle.Start(ctx, c, big, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var read atomic.Int64
	reader := e.byteCountingClient(&read)
	stop := e.monitorReads()
	for _, job := range []string{"done", "idle"} {
		runs, err := reader.Runs(ctx, job)
		if err != nil || len(runs) != 1 || runs[0].Args != nil || runs[0].Result != nil {
			t.Fatalf("Runs(%s): %d runs (%v); want one, without arguments or result", job, len(runs), err)
		}
		counts, err := reader.CountRuns(ctx, job)
		if err != nil || len(counts) != 1 || counts[runs[0].State] != 1 {
			t.Errorf("CountRuns(%s) = %v (%v), want one run in state %s", job, counts, err, runs[0].State)
		}
	}
	active, err := reader.ActiveRuns(ctx, "idle")
	if err != nil || len(active) != 1 || active[0].ID != idleID || active[0].State.Ended() {
		t.Errorf("ActiveRuns(idle) = %v (%v), want the idle run", active, err)
	}
	if active, err := reader.ActiveRuns(ctx, "done"); err != nil || len(active) != 0 {
		t.Errorf("ActiveRuns(done) = %v (%v), want none: its run ended", active, err)
	}
	st, err := reader.StatusUpTo(ctx, doneID, 0)
	if err != nil || st.State != mapreduce.StateSucceeded || st.Args != nil || st.Result != nil ||
		st.ArgsBytes != 1<<20 || st.ResultBytes != 1<<20 || st.Done != 1 {
		t.Errorf("StatusUpTo(0) = %+v (%v); want the summary, and the sizes of the arguments and the result", st, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	st, err = reader.Wait(wctx, idleID)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || st == nil || st.ID != idleID || st.Args != nil {
		t.Errorf("Wait on a run that does not end: %v, %v; want the deadline and the run's summary", st, err)
	}
	cmds := stop()
	if n := read.Load(); n > 64<<10 {
		t.Errorf("listing, counting and polling read %d bytes from Redis; want a few KiB, no 1 MiB value", n)
	}
	if w := testenv.ReadsWholeValue(cmds); w != nil {
		t.Errorf("a listing or poll read a whole value: %q", w)
	}
	if len(cmds) == 0 {
		t.Error("MONITOR saw no command: the check above proves nothing")
	}

	// One run shown whole still has both.
	before := read.Load()
	whole, err := reader.Status(ctx, doneID)
	if err != nil || len(whole.Args) != 1<<20 || len(whole.Result) != 1<<20 || whole.ArgsBytes != 1<<20 {
		t.Errorf("Status: %d bytes of arguments, %d of result (%v); want both whole", len(whole.Args), len(whole.Result), err)
	}
	if n := read.Load() - before; n < 2<<20 {
		t.Errorf("Status read %d bytes, want the 2 MiB of arguments and result: the byte count above proves nothing", n)
	}
	small, err := reader.StatusUpTo(ctx, doneID, 2<<20)
	if err != nil || len(small.Args) != 1<<20 || len(small.Result) != 1<<20 {
		t.Errorf("StatusUpTo(2 MiB): %d bytes of arguments, %d of result (%v); want both", len(small.Args), len(small.Result), err)
	}
	if _, err := reader.StatusUpTo(ctx, "done:nosuch", 0); !errors.Is(err, mapreduce.ErrRunNotFound) {
		t.Errorf("StatusUpTo of a run that does not exist: %v, want ErrRunNotFound", err)
	}
}
