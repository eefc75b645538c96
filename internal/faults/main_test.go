//go:build linux

package faults_test

import (
	"os"
	"testing"

	"github.com/batchmr/batchmr/internal/testenv"
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
