package pgsource_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// pgsource logs to the logger its context carries (mapreduce.Logger): in a
// job's Map, the worker's, with the page's run, job, page and attempt. So
// its warning that a cancelled query's permit went back unchecked says
// which page's query it was, and which semaphore's permit, rather than
// going to slog.Default() without either.
func TestPgsourceWarnsThroughTheContextsLoggerWithTheStepsAttributes(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
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
	for _, r := range logs.Records(t) {
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
		t.Errorf("no pgsource warning reached the context's logger; got %v", logs.Records(t))
	}
}
