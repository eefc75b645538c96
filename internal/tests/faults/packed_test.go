//go:build linux

package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// countArgs are the arguments of a run of "counts" (testdata/sumworker):
// pages that take microseconds, so that the run packs them several to a
// task (docs/mapreduce.md, "Packing").
type countArgs struct {
	Pages int `json:"pages"`
}

func (a countArgs) job() string      { return "counts" }
func (a countArgs) pages(*fleet) int { return a.Pages }
func (a countArgs) String() string {
	return fmt.Sprintf("a run of counts (%d pages of microseconds)", a.Pages)
}
func (a countArgs) want(f *fleet) result { return countsOf(a.Pages) }

// countsOf is a run of counts' result over pages 1..n, computed here
// rather than by the worker's code: page i's value is i*7919 mod 100000.
func countsOf(n int) result {
	r := result{Rows: int64(n), Pages: n}
	for i := int64(1); i <= int64(n); i++ {
		r.Sum += i * 7919 % 100000
	}
	return r
}

// countPages is how many pages a run of counts has: enough that it runs
// for seconds at the packed rate, so that Redis dies with most of the run
// still to come. BATCHMR_CHAOS_PAGES scales it as it scales the other runs.
func countPages(t *testing.T) int { return 500 * defaultPages(t) }

// A run whose pages take microseconds packs them, up to 64 to a task, and
// finds its tasks by their groups' first pages from then on: the split's
// feeds, the orphan scan and the reconciler all go by that. Redis killed
// with kill -9 once the run has packed, and restarted with its AOF 3 s
// later, loses up to its last second of writes: tasks enqueued or done,
// pages recorded, feed marks moved. The run must still end exact, every
// page counted once, and cost no more than an outage of an unpacked run
// may.
func TestAPackedRunSurvivesRedisKilledAndRestartedWithAOFExactly(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		a := countArgs{Pages: countPages(t)}
		base := f.baseline(a)
		id := f.start(a)
		f.waitDone(id, a.Pages/4)
		st, err := f.mr.Status(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.PagesPerTask < 2 || st.Done >= a.Pages/2 {
			t.Fatalf("run %s before the fault: %d pages a task from page %d, %d of %d done: the fault would not hit a packed run mid-way (a faster machine needs more pages: BATCHMR_CHAOS_PAGES)",
				id, st.PagesPerTask, st.PackedFrom, st.Done, a.Pages)
		}
		t.Logf("before the fault: %d of %d pages done, %d a task from page %d", st.Done, a.Pages, st.PagesPerTask, st.PackedFrom)
		began := time.Now()
		f.redis.Kill()
		time.Sleep(3 * time.Second)
		f.redis.Start()
		back := time.Now()
		f.follow(id)
		f.checkProgressResumed(id, back, redisResume, reqRedisResume)
		st = f.finish(id, a, back.Add(base+outageCost+5*time.Second), reqOutageCost)
		if st != nil && st.State.Ended() {
			f.checkCost(st, base, back.Sub(began), outageCost, reqOutageCost)
		}
	})
}

// checkProgressResumed fails the test unless run id records a page within
// bound of back, when the fault ended: work resumed. (The runs of sums
// show it in Postgres; these pages run no query.)
func (f *fleet) checkProgressResumed(id string, back time.Time, bound time.Duration, req string) {
	f.t.Helper()
	first := -1
	if !testenv.Eventually(time.Until(back.Add(bound+10*time.Second)), func() bool {
		st, err := f.mr.Status(context.Background(), id)
		switch {
		case err != nil:
		case st.State.Ended():
			// It recorded its last page by then.
			d := st.Finished.Sub(back)
			f.t.Logf("the run ended %v after the fault did (bound %v for its first page)", d.Round(time.Millisecond), bound)
			if d > bound {
				f.t.Errorf("%s: the run's first page after the fault is not known; it ended %v after the fault did", req, d.Round(time.Millisecond))
			}
			return true
		case first < 0:
			first = st.Done
		case st.Done > first:
			d := time.Since(back)
			f.t.Logf("the run recorded pages again %v after the fault ended (bound %v)", d.Round(time.Millisecond), bound)
			if d > bound {
				f.t.Errorf("%s: the run recorded no page until %v after the fault ended", req, d.Round(time.Millisecond))
			}
			return true
		}
		return false
	}) {
		f.t.Errorf("%s: the run recorded no page in the %v after the fault ended", req, time.Since(back).Round(time.Millisecond))
	}
}
