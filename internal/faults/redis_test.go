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
func TestAnEightSecondBlackholeBetweenWorkersAndRedisCostsAtMostItsLengthPlusTenSeconds(t *testing.T) {
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{Proxy: true})
		f.through(redisFault, func() {
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
		f.through(redisFault, func() {
			f.redis.Kill()
			time.Sleep(10 * time.Second)
			f.redis.Start()
		})
	})
}
