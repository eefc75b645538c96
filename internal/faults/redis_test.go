//go:build linux

package faults_test

import (
	"testing"
	"time"
)

// Redis killed with kill -9 mid-run and restarted with its AOF 3 s later,
// as a supervisor restarts a crashed server: the workers' permits of
// before the crash must not stay taken until their leases run out (F1: no
// worker query for 30 s).
func TestRedisKilledAndRestartedWithAOFMidRunCostsSecondsNotALease(t *testing.T) {
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.throughRedisFault(func() {
			f.redis.Kill()
			time.Sleep(3 * time.Second)
			f.redis.Start()
		})
	})
}

// The network between the workers and Redis cut for 8 s mid-run:
// connections closed, new ones refused (F2: the run took 121 s instead of
// 18 s, tasks stuck "active" in asynq).
func TestAnEightSecondCutBetweenWorkersAndRedisCostsAtMostTheCutPlusTenSeconds(t *testing.T) {
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{Proxy: true})
		f.throughRedisFault(func() {
			f.proxy.Cut()
			time.Sleep(8 * time.Second)
			f.proxy.Restore()
		})
	})
}

// The network between the workers and Redis drops every packet for 8 s
// mid-run: connections stay open and calls hang until the clients' own
// timeouts, the harder kind of partition.
func TestAnEightSecondBlackholeBetweenWorkersAndRedisCostsAtMostItsLengthPlusTenSeconds(t *testing.T) {
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{Proxy: true})
		f.throughRedisFault(func() {
			f.proxy.Blackhole()
			time.Sleep(8 * time.Second)
			f.proxy.Restore()
		})
	})
}

// Redis down for 10 s mid-run (killed, then started again with its AOF).
func TestARunSurvivesATenSecondRedisOutageAndResumesWithinTwoSeconds(t *testing.T) {
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.throughRedisFault(func() {
			f.redis.Kill()
			time.Sleep(10 * time.Second)
			f.redis.Start()
		})
	})
}

// throughRedisFault runs the default run and, once a quarter of its pages
// are done, takes Redis away from the workers with fault, which returns
// once Redis is back. The run must succeed exact, work resume within
// redisResume of Redis being back, the run cost at most the outage plus
// outageCost, Postgres never see more worker queries than permits, and no
// permit be held once the run has ended.
func (f *fleet) throughRedisFault(fault func()) {
	f.t.Helper()
	a := defaultRun()
	base := f.baseline(a)
	id := f.start(a)
	f.waitDone(id, f.pagesOf(a)/4)
	began := time.Now()
	fault()
	back := time.Now()
	f.sampler.watchClosely(5 * time.Second) // permits change hands in a burst
	f.t.Logf("Redis was away from the workers for %v", back.Sub(began).Round(time.Millisecond))
	// Past the cost's bound, with time to say by how much.
	st := f.finish(id, a, back.Add(base+outageCost+5*time.Second), reqOutageCost)
	f.checkResumed(back, redisResume, reqRedisResume)
	if st != nil && st.State.Ended() {
		f.checkCost(st, base, back.Sub(began), outageCost, reqOutageCost)
		f.checkPermitsFree(st.Finished)
	}
	f.checkPermits()
}
