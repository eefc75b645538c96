package main

import (
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// A windowed run splits for most of its life: the pages its Split said to
// expect give the progress bar and the ETA until the total is known.
func TestTheProgressLineUsesTheExpectedPagesUntilTheTotalIsKnown(t *testing.T) {
	splitting := &mapreduce.Status{State: mapreduce.StateSplitting, Total: -1, Expected: 1000, Done: 250}
	line := progressLine(splitting, 10*time.Second)
	if !strings.Contains(line, "250/~1000 pages") || !strings.Contains(line, "ETA 30s") || !strings.HasPrefix(line, "[#######·") {
		t.Errorf("while splitting with 1000 pages expected: %q", line)
	}
	if got := progress(splitting); got != "250/~1000 done" {
		t.Errorf("progress: %q", got)
	}
	unknown := &mapreduce.Status{State: mapreduce.StateSplitting, Total: -1, Expected: -1, Done: 250}
	if line := progressLine(unknown, 10*time.Second); !strings.Contains(line, "250/? pages") {
		t.Errorf("while splitting with nothing expected: %q", line)
	}
	known := &mapreduce.Status{State: mapreduce.StateMapping, Total: 1000, Expected: 990, Done: 500}
	if line := progressLine(known, 10*time.Second); !strings.Contains(line, "500/1000 pages") {
		t.Errorf("once the total is known, it wins over the expected pages: %q", line)
	}
}
