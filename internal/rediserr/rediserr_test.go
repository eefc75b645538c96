package rediserr_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// A command Redis refuses as it is queued aborts the transaction, and EXEC
// says only that; Tx returns the refusal that says why. (Over maxmemory
// the refusal is OOM's; an unknown command is refused the same way, at
// queue time, without filling the shared test server.)
func TestTxReturnsTheRefusalThatAbortedATransaction(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	cmds, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, prefix+":a", 1, 0)
		p.Do(ctx, "NOSUCHCOMMAND", prefix+":a")
		return nil
	})
	if err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
		t.Fatalf("the transaction: %v, want EXECABORT (the premise)", err)
	}
	if got := rediserr.Tx(cmds, err); got == nil || !strings.Contains(got.Error(), "unknown command") {
		t.Errorf("Tx: %v, want the refusal of NOSUCHCOMMAND", got)
	}
	if n, _ := rdb.Exists(ctx, prefix+":a").Result(); n != 0 {
		t.Errorf("the aborted transaction wrote its SET")
	}
	if got := rediserr.Tx(cmds, nil); got != nil {
		t.Errorf("Tx of no error: %v", got)
	}
}

// asynq keeps the error of one of its scripts only as text, after its own
// words: an enqueue while Redis reloads its AOF after a restart failed
// with "UNKNOWN: redis eval error: LOADING …", which was not taken for
// transient, and the split that enqueued failed and waited for asynq's
// retry (the fault suite's packed scenario caught it).
func TestAnAsynqScriptErrorIsTransientWhenRedissReplyIs(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.Redis(t)
	ctx := context.Background()
	for reply, want := range map[string]bool{
		"LOADING Redis is loading the dataset in memory":                true,
		"READONLY You can't write against a read only replica.":         true,
		"ERR user_script:1: Script attempted to access nonexistent key": false,
	} {
		err := rdb.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, reply).Err()
		if err == nil || !strings.HasPrefix(err.Error(), reply[:3]) {
			t.Fatalf("Redis's reply: %v, want %q (the premise)", err, reply)
		}
		// As asynq's internal/rdb formats it: errors.E(op, code, fmt.Sprintf("redis eval error: %v", err)).
		for _, code := range []string{"UNKNOWN", "INTERNAL_ERROR"} {
			asynqErr := fmt.Errorf("%s: redis eval error: %v", code, err)
			if got := rediserr.Transient(asynqErr); got != want {
				t.Errorf("Transient(%q) = %v, want %v", asynqErr, got, want)
			}
		}
	}
}

// A failover's refusals (READONLY from a demoted primary, LOADING from a
// server still reading its data) pass by themselves, also when a caller
// has wrapped them: the reply's code is not at the start of the message
// then.
func TestAWrappedFailoverRefusalIsTransient(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.Redis(t)
	ctx := context.Background()
	for _, reply := range []string{"READONLY You can't write against a read only replica.", "LOADING Redis is loading the dataset in memory"} {
		err := rdb.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, reply).Err()
		if err == nil || !strings.HasPrefix(err.Error(), reply[:7]) {
			t.Fatalf("Redis's reply: %v, want %q (the premise)", err, reply)
		}
		wrapped := fmt.Errorf("mapreduce: start %q: %w", "nightly", err)
		if !rediserr.Transient(err) || !rediserr.Transient(wrapped) {
			t.Errorf("%q: Transient %v, wrapped %v; want both true", reply, rediserr.Transient(err), rediserr.Transient(wrapped))
		}
	}
	if err := rdb.Eval(ctx, "return redis.error_reply('ERR no such thing')", nil).Err(); rediserr.Transient(fmt.Errorf("wrapped: %w", err)) {
		t.Errorf("%v is not transient", err)
	}
}

// A node that cannot be reached, a connection dropped, and a Cluster's
// MOVED say the client's map of slots may be stale; the caller's own
// cancellation, a missing key and a refusal of the command do not.
func TestStaleSlotsAreNodeFailuresAndMovedNotTheCallersOwnErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A node that is not there: dial a port nobody listens on.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer dead.Close()
	refused := dead.Ping(ctx).Err()
	// MOVED: a plain client of one node, asked for keys of every primary.
	addrs := testenv.RedisClusterAddrs(t)
	node := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer node.Close()
	var moved error
	for i := 0; moved == nil && i < 20; i++ {
		if err := node.Get(ctx, fmt.Sprintf("{tag%d}", i)).Err(); err != nil && strings.HasPrefix(err.Error(), "MOVED") {
			moved = err
		}
	}
	unknown := node.Do(ctx, "NOSUCHCOMMAND").Err()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name  string
		err   error
		stale bool
	}{
		{"a node refusing connections", refused, true},
		{"a node refusing connections, wrapped", fmt.Errorf("mapreduce: record: %w", refused), true},
		{"a dropped connection", io.EOF, true},
		{"MOVED", moved, true},
		{"the caller's cancellation", node.Ping(cancelled).Err(), false},
		{"a missing key", redis.Nil, false},
		{"an unknown command", unknown, false},
		{"a closed client", redis.ErrClosed, false},
		{"no error", nil, false},
	} {
		if tc.err == nil && tc.name != "no error" {
			t.Fatalf("%s: the test found no such error", tc.name)
		}
		if got := rediserr.StaleSlots(tc.err); got != tc.stale {
			t.Errorf("StaleSlots(%s: %v) = %v; want %v", tc.name, tc.err, got, tc.stale)
		}
	}
}
