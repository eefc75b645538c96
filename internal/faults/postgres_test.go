//go:build linux

package faults_test

import (
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/testenv"
)

// Postgres restarted mid-run (a fast shutdown, as for maintenance, then
// started again): every worker's connections break at once.
func TestARunSurvivesAPostgresRestartMidRunExactly(t *testing.T) {
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.throughDatabaseFault(func() { f.pg.Restart(testenv.StopFast) })
	})
}

// Postgres crashed and away for 60 s mid-run, then back (F6: a 13 s outage
// failed a whole run). With the job's default options.
func TestARunSurvivesASixtySecondPostgresOutageMidRunExactly(t *testing.T) {
	t.Parallel() // it mostly waits: the timing of others does not suffer
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.throughDatabaseFault(func() {
			f.pg.Stop(testenv.StopImmediate)
			time.Sleep(60 * time.Second)
			f.pg.Start()
		})
	})
}

// throughDatabaseFault runs the default run and, once a quarter of its
// pages are done, takes Postgres away with fault, which returns once
// Postgres accepts connections again. The run must succeed exact, work
// resume within dbResume of Postgres being back, the run cost at most the
// outage plus dbResume plus outageCost, Postgres never see more worker
// queries than permits, and no permit be held once the run has ended.
func (f *fleet) throughDatabaseFault(fault func()) {
	f.t.Helper()
	a := defaultRun()
	base := f.baseline(a)
	id := f.start(a)
	f.waitDone(id, f.pagesOf(a)/4)
	began := time.Now()
	fault()
	back := time.Now()
	f.sampler.watchClosely(5 * time.Second) // permits change hands in a burst
	f.t.Logf("Postgres was away for %v", back.Sub(began).Round(time.Millisecond))
	// Past the cost's bound, with time to say by how much.
	st := f.finish(id, a, back.Add(base+dbResume+outageCost+5*time.Second), reqDBCost)
	f.checkResumed(back, dbResume, reqDBResume)
	if st != nil && st.State.Ended() {
		f.checkCost(st, base, back.Sub(began), dbResume+outageCost, reqDBCost)
		f.checkPermitsFree(st.Finished)
	}
	f.checkPermits()
}
