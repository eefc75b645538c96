//go:build linux

package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// cancelGone bounds how long a cancelled run's queries may go on: its
// handlers see the cancel within mapreduce's CancelPoll (250 ms) and
// cancel their queries at once.
const cancelGone = 2 * time.Second

// cancelRounds is how many runs the cancel scenario cancels: a query run
// without a permit after a cancel overlaps the others by milliseconds
// only, so each cancel is one more chance to catch it.
const cancelRounds = 3

// A run of long queries (pages of pg_sleep(30)) with ten times more
// handlers than permits, cancelled while every permit is taken and every
// other handler waits for one: Postgres never sees more worker queries
// than permits (F3: it saw 4-5 with 3), and every query of the run is gone
// within cancelGone. Three runs, one after the other.
func TestCancellingARunOfLongQueriesEndsEveryQueryAndNeverOverrunsThePermits(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFleet(t, fleetConfig{})
		a := runArgs{PageSize: int(f.rows/30) + 1, SleepMS: 30_000} // 30 pages for 30 handlers
		var gone time.Time
		for round := 1; round <= cancelRounds; round++ {
			id := f.start(a)
			f.waitPermitsFull(a)

			f.sampler.watchClosely(2*cancelGone + time.Second)
			cancelled := time.Now()
			if err := f.mr.Cancel(ctx, id); err != nil {
				t.Fatal(err)
			}
			var ok bool
			gone, ok = f.waitNoWorkerQueryFor(cancelGone, cancelled, cancelled.Add(2*cancelGone))
			d := max(gone.Sub(cancelled), 0)
			most, _ := f.sampler.maximum()
			t.Logf("cancel %d at %s: the last worker query was seen %v later (bound %v); the most at once so far: %d",
				round, cancelled.Format("15:04:05.000"), d.Round(time.Millisecond), cancelGone, most)
			if st, err := f.mr.Status(ctx, id); err != nil || st.State != mapreduce.StateCancelled {
				t.Errorf("run %d is %s (%v), want cancelled", round, describe(st), err)
			}
			if !ok || d > cancelGone {
				active, at, _ := f.sampler.latest()
				t.Errorf("cancelling a run ends its queries within %v: %d worker queries still ran at %s, %v after cancel %d; "+
					"the last seen, with their start relative to the cancel: %s; queries started after the cancel: %d",
					cancelGone, active, at.Format("15:04:05.000"), d.Round(time.Millisecond), round,
					f.sampler.lastSeenQueries(cancelled), f.sampler.startsBetween(cancelled, time.Now()))
				break // the next run would share the permits with what is left of this one
			}
		}
		f.checkPermits()
		f.checkPermitsFree(gone)
	})
}

// waitPermitsFull waits until every permit is taken by a query of a run
// with a's pages, and every page is in a handler's hands: those without a
// permit are queued in Redis for one.
func (f *fleet) waitPermitsFull(a runArgs) {
	f.t.Helper()
	insp := asynq.NewInspectorFromRedisClient(f.redis.Client)
	var last string
	if !testenv.Eventually(30*time.Second, func() bool {
		active, _, _ := f.sampler.latest()
		q, err := insp.GetQueueInfo(queue)
		st, serr := f.sem.Stats(context.Background())
		last = fmt.Sprintf("%d queries active, queue %+v (%v), %d permits held and %d waiting (%v)", active, q, err, st.Held, len(st.Waiters), serr)
		return err == nil && serr == nil && active == permits && q.Active == a.pages(f) && q.Pending == 0 &&
			st.Held == permits && len(st.Waiters) == a.pages(f)-permits
	}) {
		f.t.Fatalf("the run did not fill its permits, with every other page waiting for one, within 30s: %s", last)
	}
}

// waitNoWorkerQueryFor waits until the sampler has seen no worker query
// for quiet since from, and returns when it last saw one (from, if none)
// and true; or, at deadline, when it last saw one and false.
func (f *fleet) waitNoWorkerQueryFor(quiet time.Duration, from, deadline time.Time) (time.Time, bool) {
	var last time.Time
	ok := testenv.Eventually(time.Until(deadline), func() bool {
		var at time.Time
		_, at, last = f.sampler.latest()
		last = later(last, from)
		return at.Sub(last) >= quiet
	})
	return last, ok
}
