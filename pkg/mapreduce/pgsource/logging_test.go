package pgsource_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// lockedBuffer is a bytes.Buffer that loggers on many goroutines can share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(l.b.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// pgsource logs to the logger its context carries (mapreduce.Logger): in a
// job's Map, the worker's, with the page's run, job, page and attempt. So
// its warning that a cancelled query's permit went back unchecked says
// which page's query it was, and which semaphore's permit, rather than
// going to slog.Default() without either.
func TestPgsourceWarnsThroughTheContextsLoggerWithTheStepsAttributes(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	step := slog.New(slog.NewJSONHandler(&logs, nil)).With(
		"run", "logged:r1", "job", "logged", "step", "map", "page", 7, "attempt", 2, "task", "t-7")
	p := startPgProxy(t)
	_, cancel, done := proxiedQuery(t, mapreduce.ContextWithLogger(context.Background(), step), p, 30*time.Second)
	p.refuse()
	cancel()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the permit was held although the server refuses connections")
	}
	var warned bool
	for _, r := range logs.records(t) {
		msg, _ := r["msg"].(string)
		if !strings.HasPrefix(msg, "pgsource: ") {
			continue
		}
		warned = true
		if r["level"] != "WARN" || r["run"] != "logged:r1" || r["job"] != "logged" || r["page"] != 7.0 ||
			r["attempt"] != 2.0 || r["task"] != "t-7" || r["semaphore"] != "db" || r["error"] == nil {
			t.Errorf("pgsource's warning without the step's attributes, its semaphore or its error: %v", r)
		}
	}
	if !warned {
		t.Errorf("no pgsource warning reached the context's logger; got %v", logs.records(t))
	}
}
