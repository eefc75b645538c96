package semaphore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
)

// ByProcess sums holders and waiters per process, in the order of their
// first grant, then of their first queued request.
func TestByProcessSumsHoldersAndWaitersPerProcessInGrantOrder(t *testing.T) {
	st := semaphore.Stats{
		Holders: []semaphore.Holder{
			{Process: "b", Weight: 2, HeldFor: time.Second},
			{Process: "a", Weight: 1, HeldFor: 3 * time.Second},
			{Process: "b", Weight: 1, HeldFor: 2 * time.Second},
		},
		Waiters: []semaphore.Waiter{
			{Process: "c", Weight: 1, Age: time.Second},
			{Process: "a", Weight: 2, Age: 4 * time.Second},
			{Process: "a", Weight: 1, Age: 5 * time.Second},
		},
	}
	want := []semaphore.ProcessStats{
		{Process: "b", Holds: 2, Held: 3, LongestHold: 2 * time.Second},
		{Process: "a", Holds: 1, Held: 1, LongestHold: 3 * time.Second, Waits: 2, Waiting: 3, OldestWait: 5 * time.Second},
		{Process: "c", Waits: 1, Waiting: 1, OldestWait: time.Second},
	}
	if got := st.ByProcess(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ByProcess = %+v, want %+v", got, want)
	}
	if got := (semaphore.Stats{}).ByProcess(); len(got) != 0 {
		t.Errorf("ByProcess of nothing = %+v", got)
	}
}
