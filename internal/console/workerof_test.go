package console_test

import (
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/procname"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// A semaphore process is named by its worker; a worker that has stopped
// renewing its catalogue entry (killed: the entry outlives it by 30 s) is
// named as silent, so that permits held by a dead worker read as such
// before its entry expires, not as a live worker's.
func TestWorkerOfNamesASilentWorkerAsSuch(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	workers := []mapreduce.WorkerInfo{
		{ID: "live", Host: "vm", PID: 10, Seen: now.Add(-2 * time.Second)},
		{ID: "dead", Host: "vm", PID: 20, Seen: now.Add(-17 * time.Second)},
	}
	for process, want := range map[string]string{
		procname.Prefix("vm", 10) + "abc": "live",
		procname.Prefix("vm", 20) + "abc": "dead (silent 17s)",
		procname.Prefix("vm", 30) + "abc": "(none)",
	} {
		if got := console.WorkerOf(process, workers, now); got != want {
			t.Errorf("WorkerOf(%q) = %q, want %q", process, got, want)
		}
	}
	if _, silent := workers[0].Silent(now); silent {
		t.Error("a worker seen 2s ago is Silent")
	}
	if d, silent := workers[1].Silent(now); !silent || d != 17*time.Second {
		t.Errorf("a worker seen 17s ago: Silent = %v, %v; want 17s, true", d, silent)
	}
}
