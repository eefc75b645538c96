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
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.through(redisFault, func() {
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
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{Proxy: true})
		f.through(redisFault, func() {
			f.proxy.Cut()
			time.Sleep(8 * time.Second)
			f.proxy.Restore()
		})
	})
}

// The network between the workers and Redis drops every packet for 8 s
// mid-run: connections stay open and calls hang until the clients' own
// timeouts, the harder kind of partition. It found two stalls a cut does
// not show: the semaphore called its own call deadline a caller's, so a
// page waiting for a permit failed for good reasons that were not
// transient and waited out the job's backoff (20 s and more); and the
// dequeues a worker gave up on reached Redis when the network healed,
// leaving tasks active that no handler ever started, which waited out the
// orphan grace meant for tasks a live worker may still hold.
//
// Its pages run four short queries each, each under a permit of its own,
// so that every worker's semaphore handle has a release in flight most of
// the time while its other handlers wait: new waiters are carried by
// those releases (the semaphore's carried enqueues), and the blackhole
// leaves carrying calls hanging with waiters in them. The scenario counts
// the carrying calls Redis ran, so that it cannot stop driving them
// unnoticed.
func TestAnEightSecondBlackholeBetweenWorkersAndRedisCostsAtMostItsLengthPlusTenSeconds(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{Proxy: true})
		a := defaultRun()
		a.Queries, a.SleepMS = 4, a.SleepMS/4
		f.baseline(a) // measured once per process: the count below is the faulted run's alone
		carries := f.countCalls("batchmr_sem_carry_")
		f.throughRun(a, redisFault, func() {
			f.proxy.Blackhole()
			time.Sleep(8 * time.Second)
			f.proxy.Restore()
		})
		n := carries()
		t.Logf("Redis ran %d carrying calls of the semaphore in the faulted run", n)
		if n < minCarries {
			t.Errorf("Redis ran %d carrying calls in the faulted run, want at least %d: the scenario no longer drives carried enqueues", n, minCarries)
		}
	})
}

// minCarries is the fewest carrying calls the blackhole scenario's
// faulted run must make: 57–91 in runs of 400 pages on the development
// VM. (It counted the undisturbed run too, which only the first scenario
// of a test process measures, so with -count a later one fell short.)
const minCarries = 25

// Redis down for 10 s mid-run (killed, then started again with its AOF).
func TestARunSurvivesATenSecondRedisOutageAndResumesWithinTwoSeconds(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.through(redisFault, func() {
			f.redis.Kill()
			time.Sleep(10 * time.Second)
			f.redis.Start()
		})
	})
}
