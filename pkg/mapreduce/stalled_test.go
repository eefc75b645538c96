package mapreduce_test

import (
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// A run that stopped moving is Stalled once a minute has passed since
// it last changed, and then has no Remaining: an ETA at its average rate
// would promise an end that is not coming. An ended run never is.
func TestARunUnchangedForAMinuteIsStalledAndHasNoETA(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	st := &mapreduce.Status{State: mapreduce.StateMapping, Total: 100, Done: 50, Expected: -1,
		Created: now.Add(-10 * time.Minute), Updated: now.Add(-time.Second)}
	if idle, stalled := st.Stalled(now); stalled || idle != time.Second {
		t.Errorf("changed 1s ago: Stalled = %v, %v; want 1s, false", idle, stalled)
	}
	if _, ok := st.Remaining(now); !ok {
		t.Error("a moving run has no Remaining")
	}
	st.Updated = now.Add(-time.Minute)
	if idle, stalled := st.Stalled(now); !stalled || idle != time.Minute {
		t.Errorf("changed a minute ago: Stalled = %v, %v; want %v, true", idle, stalled, time.Minute)
	}
	if d, ok := st.Remaining(now); ok {
		t.Errorf("a stalled run: Remaining = %v, want none", d)
	}
	st.State, st.Finished = mapreduce.StateSucceeded, now.Add(-time.Hour)
	if _, stalled := st.Stalled(now); stalled {
		t.Error("an ended run is Stalled")
	}
}

// Only a run whose pages are under way can be stalled: a Reduce, or a
// split's first query, may take minutes and records nothing meanwhile.
func TestARunThatReducesOrSplitsBeforeItsFirstPageIsNotStalled(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	long := now.Add(-time.Hour)
	for _, st := range []*mapreduce.Status{
		{State: mapreduce.StateReducing, Total: 10, Done: 10, Updated: long},
		{State: mapreduce.StateSplitting, Total: -1, Expected: -1, Updated: long},
	} {
		if _, stalled := st.Stalled(now); stalled {
			t.Errorf("%s with %d pages recorded, unchanged for an hour: Stalled, want not", st.State, st.Done)
		}
	}
	splitting := &mapreduce.Status{State: mapreduce.StateSplitting, Total: -1, Expected: -1, Done: 3, Updated: long}
	if _, stalled := splitting.Stalled(now); !stalled {
		t.Error("a split with pages recorded, unchanged for an hour: not Stalled")
	}
}
