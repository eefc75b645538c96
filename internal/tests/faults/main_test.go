//go:build linux

package faults_test

import (
	"os"
	"testing"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// binaries holds the worker binary, built once per test binary: every
// scenario starts three of it, and a link per scenario would cost seconds.
var binaries testenv.Binaries

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	os.Exit(code)
}

// workerBinary returns the path of testdata/sumworker, built.
func workerBinary(t *testing.T) string {
	return binaries.Build(t, "./testdata/sumworker")
}

// The suite runs as two passes that make test starts at once, chosen by
// BATCHMR_FAULTS: "timed" runs the scenarios whose bounds are timed against
// an undisturbed run, one after another; "waiting" runs those that mostly
// wait (a 60 s outage, a clock two hours fast), side by side. Unset, one
// process runs both, the waiting ones after the timed.
const passVar = "BATCHMR_FAULTS"

// timed marks a scenario whose timing bounds others would distort: it runs
// alone in its pass.
func timed(t *testing.T) {
	if os.Getenv(passVar) == "waiting" {
		t.Skip("a timed scenario: it runs in the BATCHMR_FAULTS=timed pass")
	}
}

// mostlyWaits marks a scenario that mostly waits, so that others' timing
// does not suffer beside it: it runs in parallel.
func mostlyWaits(t *testing.T) {
	if os.Getenv(passVar) == "timed" {
		t.Skip("a waiting scenario: it runs in the BATCHMR_FAULTS=waiting pass")
	}
	t.Parallel()
}
