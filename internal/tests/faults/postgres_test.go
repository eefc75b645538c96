//go:build linux

package faults_test

import (
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// Postgres restarted mid-run (a fast shutdown, as for maintenance, then
// started again): every worker's connections break at once.
func TestARunSurvivesAPostgresRestartMidRunExactly(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.through(databaseFault, func() { f.pg.Restart(testenv.StopFast) })
	})
}

// Postgres crashed and away for 60 s mid-run, then back (F6: a 13 s outage
// failed a whole run). With the job's default options.
func TestARunSurvivesASixtySecondPostgresOutageMidRunExactly(t *testing.T) {
	mostlyWaits(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		f.through(databaseFault, func() {
			f.pg.Stop(testenv.StopImmediate)
			time.Sleep(60 * time.Second)
			f.pg.Start()
		})
	})
}
