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
	now := time.Now()
	created := now.Add(-10 * time.Second)
	splitting := &mapreduce.Status{State: mapreduce.StateSplitting, Total: -1, Expected: 1000, Done: 250, Created: created}
	line := progressLine(splitting, now)
	if !strings.Contains(line, "250/~1000 pages") || !strings.Contains(line, "ETA 30s") || !strings.HasPrefix(line, "[#######·") {
		t.Errorf("while splitting with 1000 pages expected: %q", line)
	}
	if got := progress(splitting); got != "250/~1000 done" {
		t.Errorf("progress: %q", got)
	}
	unknown := &mapreduce.Status{State: mapreduce.StateSplitting, Total: -1, Expected: -1, Done: 250, Created: created}
	if line := progressLine(unknown, now); !strings.Contains(line, "250/? pages") {
		t.Errorf("while splitting with nothing expected: %q", line)
	}
	known := &mapreduce.Status{State: mapreduce.StateMapping, Total: 1000, Expected: 990, Done: 500, Created: created}
	if line := progressLine(known, now); !strings.Contains(line, "500/1000 pages") {
		t.Errorf("once the total is known, it wins over the expected pages: %q", line)
	}
}

// Following a run that began before the command did (scheduler run --key
// of a run that exists, retry --wait, or a run that has ended) shows the
// run's own rate: its pages over its own time, not over the time since
// the command started.
func TestTheProgressLineShowsTheRunsOwnRateWhoeverStartedIt(t *testing.T) {
	now := time.Now()
	ended := &mapreduce.Status{State: mapreduce.StateSucceeded, Total: 1000, Done: 1000,
		Created: now.Add(-time.Hour), Finished: now.Add(-time.Hour + 100*time.Second)}
	if line := progressLine(ended, now); !strings.Contains(line, " 10/s ") || !strings.Contains(line, "ETA —") {
		t.Errorf("a run that did 1000 pages in 100s, an hour ago: %q", line)
	}
	mid := &mapreduce.Status{State: mapreduce.StateMapping, Total: 1000, Done: 300, Created: now.Add(-60 * time.Second)}
	if line := progressLine(mid, now); !strings.Contains(line, " 5/s ") || !strings.Contains(line, "ETA 2m20s") {
		t.Errorf("a run at 300 of 1000 pages after 60s: %q", line)
	}
}

// The runs table's ERROR column is 60 characters: the run ID its row
// already shows would take most of them, and cut off the cause.
func TestTheRunsTableShowsAnErrorsCauseNotTheRunIDAgain(t *testing.T) {
	id := "count-kinds:20261123T104616.839Z-4ff24455"
	st := &mapreduce.Status{ID: id, Error: "mapreduce: split of " + id + " after 3 pages: page_size -1: give a page size of at least 1"}
	got := oneLine(shortError(st), 60)
	if want := "split after 3 pages: page_size -1: give a page size of at l…"; got != want {
		t.Errorf("ERROR column %q, want %q", got, want)
	}
}
