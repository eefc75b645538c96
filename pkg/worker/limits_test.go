package worker_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/batchmr/batchmr/pkg/worker"
)

// The limit protects the database, and lives in Redis: a worker's own
// setting (--db-permits) applies only while Redis holds none. So a worker
// says at start what Redis holds, and warns when Redis loses it — a
// restart without persistence, a FLUSHDB — or when it comes back as a
// worker's own setting, which quietly undoes the operator's limit.
func TestAWorkerWarnsWhenTheFleetsLimitIsLostOrSetAgainFromItsFlags(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 3, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	if err := sem.SetLimit(ctx, 3); err != nil { // the operator's
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := worker.WithLimitChecks(worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix, Permits: map[string]int{"db": 8},
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, 50*time.Millisecond)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx, cfg, skewedJob) }()
	defer func() { stop(); <-done }()

	started := logs.WaitForRecord(t, 10*time.Second, "worker: started")
	if got, _ := json.Marshal(started["permits"]); string(got) != `{"db":3}` {
		t.Errorf("the start line's permits: %s, want what Redis holds, {\"db\":3}; the line: %v", got, started)
	}
	limitKey := prefix + ":sem:{db}:limit"
	if err := rdb.Del(ctx, limitKey).Err(); err != nil { // Redis lost it
		t.Fatal(err)
	}
	if r := logs.WaitForRecord(t, 10*time.Second, "has lost its limit"); r["level"] != "WARN" || r["limit_was"] != 3.0 || !strings.Contains(r["msg"].(string), "scheduler permits set db N") {
		t.Errorf("the loss: %v, want a warning with the limit that was and the fix", r)
	}
	if err := sem.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	logs.WaitForRecord(t, 10*time.Second, `limit set`)
	// A worker's first call after a loss sets its own setting, before this
	// one looks: it sees the limit go from the operator's to its own.
	if err := rdb.Set(ctx, limitKey, "8", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if r := logs.WaitForRecord(t, 10*time.Second, "changed to this worker's own setting"); r["level"] != "WARN" || r["limit_was"] != 3.0 || r["limit"] != 8.0 {
		t.Errorf("the limit back at the worker's own setting: %v, want a warning from 3 to 8", r)
	}
	if err := sem.SetLimit(ctx, 5); err != nil { // an operator's change
		t.Fatal(err)
	}
	if r := logs.WaitForRecord(t, 10*time.Second, `limit changed"`); r["level"] != "INFO" || r["limit_was"] != 8.0 || r["limit"] != 5.0 {
		t.Errorf("an operator's change: %v, want info from 8 to 5", r)
	}
}

// A worker with a database is a candidate for the controller of its
// database permits: with the semaphore in auto mode, it takes the lease,
// moves N from what releases report, and its limit watch says only that
// the mode began, not each move.
func TestAWorkerWithADatabaseControlsItsPermitsInAutoMode(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 4, Prefix: prefix + ":sem", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: 1, Max: 8, Fixed: 4}); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := worker.WithLimitChecks(worker.Config{RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t), Prefix: prefix,
		Permits: map[string]int{"db": 4}, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, 50*time.Millisecond)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx, cfg, skewedJob) }()
	defer func() { stop(); <-done }()
	logs.WaitForRecord(t, 10*time.Second, "worker: started")

	// Work under the fleet's permits, whose releases report to the controller.
	stopLoad := testenv.Loop(t, 1, func(ctx context.Context) {
		_ = sem.Do(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	})
	defer stopLoad() // before the worker stops
	logs.WaitForRecord(t, 10*time.Second, "this process now controls the limit")
	logs.WaitForRecord(t, 10*time.Second, `semaphore \"db\" is in auto mode`)
	// The controller measures its baseline at min (1), then moves N
	// back up: two moves, each seconds long, that the watch sees.
	atMin := false
	testenv.WaitFor(t, 30*time.Second, "the worker's controller to move N to min and back up", func() bool {
		st, err := sem.Stats(ctx)
		if err != nil || st.Auto.Why != "controller" {
			return false
		}
		atMin = atMin || st.Limit == 1
		return atMin && st.Limit > 1 && st.Auto.Signals.Epoch > 0
	})
	for _, r := range logs.Records(t) {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "limit changed") {
			t.Errorf("in auto mode the limit watch logged %q", msg)
		}
	}
}
