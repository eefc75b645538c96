//go:build linux

package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// cancelGone bounds how long a cancelled run's queries may go on: its
// handlers see the cancel within mapreduce's CancelPoll (250 ms) and
// cancel their queries at once.
const cancelGone = 2 * time.Second

// A run of long queries (pages of pg_sleep(30)) with ten times more
// handlers than permits, cancelled while every permit is taken and
// handlers wait for one: Postgres never sees more worker queries than
// permits (F3: it saw 4-5 with 3), and every query of the run is gone
// within cancelGone and stays gone.
func TestCancellingARunOfLongQueriesEndsEveryQueryAndNeverOverrunsThePermits(t *testing.T) {
	soak(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFleet(t, fleetConfig{})
		a := runArgs{PageSize: int(f.rows/30) + 1, SleepMS: 30_000} // 30 pages for 30 handlers
		id := f.start(a)
		// Every permit taken, and handlers queued for one.
		deadline := time.Now().Add(30 * time.Second)
		for {
			active, _, _ := f.sampler.latest()
			st, err := f.sem.Stats(ctx)
			if err == nil && active == permits && len(st.Waiters) > 0 {
				t.Logf("%d worker queries running, %d handlers waiting for a permit", active, len(st.Waiters))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the run did not fill its permits within 30s: %d queries active, semaphore %+v (%v)", active, st, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)

		cancelled := time.Now()
		if err := f.mr.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		gone := f.waitNoWorkerQuery(cancelled, cancelled.Add(time.Minute))
		d := gone.Sub(cancelled)
		t.Logf("cancelled at %s; every worker query was gone %v later (bound %v)", cancelled.Format("15:04:05.000"), d.Round(time.Millisecond), cancelGone)
		if d > cancelGone {
			t.Errorf("cancelling a run ends its queries within %v: the last was gone only %v after the cancel", cancelGone, d.Round(time.Millisecond))
		}
		// And none comes back.
		time.Sleep(time.Second)
		if _, _, last := f.sampler.latest(); last.After(gone) {
			t.Errorf("a cancelled run starts no query: a worker query was running at %s, after all had gone at %s",
				last.Format("15:04:05.000"), gone.Format("15:04:05.000"))
		}
		if st, err := f.mr.Status(ctx, id); err != nil || st.State != mapreduce.StateCancelled {
			t.Errorf("the run is %s (%v), want cancelled", describe(st), err)
		}
		f.checkPermits()
		f.checkPermitsFree(gone)
	})
}

// waitNoWorkerQuery waits for a sample taken after from that sees no
// worker query, and returns when it was taken; it fails the test at
// deadline.
func (f *fleet) waitNoWorkerQuery(from, deadline time.Time) time.Time {
	f.t.Helper()
	for {
		active, at, _ := f.sampler.latest()
		if active == 0 && at.After(from) {
			return at
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d worker queries still run at %s", active, at.Format("15:04:05.000"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
