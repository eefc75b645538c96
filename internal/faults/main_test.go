//go:build linux

package faults_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The worker binary is built once per test binary, on first use, and
// removed by TestMain: every scenario starts three of it, and one link per
// scenario would cost seconds each.
var (
	buildOnce sync.Once
	binDir    string
	bin       string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// workerBinary returns the path of testdata/sumworker, built.
func workerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "faults-test-"); buildErr != nil {
			return
		}
		bin = filepath.Join(binDir, "sumworker")
		if out, err := exec.Command("go", "build", "-o", bin, "./testdata/sumworker").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("building the worker (testdata/sumworker): %v", buildErr)
	}
	return bin
}
