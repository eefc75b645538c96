package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// asynq keeps Redis's errors as text in its own lines; those of an outage
// are told from its others by that text.
func TestAsynqsLinesOfARedisOutageAreToldByTheirText(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]outage.Cause{
		"Failed to write server state data: UNKNOWN: redis command error: SADD failed: dial tcp 127.0.0.1:6379: connect: connection refused": outage.Redis,
		"Failed to forward scheduled tasks: INTERNAL_ERROR: redis eval error: dial unix /tmp/redis.sock: connect: no such file or directory": outage.Redis,
		"Dequeue error: UNKNOWN: redis eval error: read tcp 127.0.0.1:5000->127.0.0.1:6379: i/o timeout":                                     outage.Redis,
		"Failed to extend lease for tasks [a b]: UNKNOWN: redis eval error: READONLY You can't write against a read only replica.":           outage.RedisFailover,
		"Dequeue error: UNKNOWN: redis eval error: CLUSTERDOWN The cluster is down":                                                          outage.RedisFailover,
		"Could not write task result for id=x: task not found":                                                                               "",
		"recoverer: could not retry lease expired task: NOT_FOUND: cannot find task":                                                         "",
	} {
		if got := asynqOutage(msg); got != want {
			t.Errorf("asynqOutage(%q) = %q, want %q", msg, got, want)
		}
	}
}

// While Redis is away asynq's lines of it are one warning; the first
// command the worker's client gets an answer to ends the outage, in one
// line. asynq's other lines pass as they are.
func TestAsynqsRedisOutageEndsWhenTheWorkersClientGetsAnAnswer(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	var buf testenv.LogBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	o := outage.New(log, "worker: asynq")
	rdb.AddHook(redisBack{o})
	l := asynqLogger{log: log, outages: o}
	for range 5 {
		l.Error("Failed to write server state data: UNKNOWN: redis command error: SADD failed: dial tcp 127.0.0.1:1: connect: connection refused")
	}
	l.Error("Could not write task result for id=x: task not found")
	if !o.Ongoing() {
		t.Fatal("no outage after asynq's errors of Redis unreachable")
	}
	if err := rdb.Get(context.Background(), prefix+":absent").Err(); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("GET of a missing key: %v (the premise: redis.Nil)", err)
	}
	var msgs []string
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var r map[string]any
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, r["level"].(string)+" "+r["msg"].(string))
	}
	want := []string{
		"WARN worker: asynq: Redis unreachable: retrying; until it ends its failures are logged at debug",
		"ERROR Could not write task result for id=x: task not found",
		"INFO worker: asynq: Redis unreachable: over",
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
}
