package worker_test

import (
	"strings"
	"testing"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/pkg/worker"
)

// The worker command returns its outcome, and MainWith alone exits on
// it: run in-process, it reports what the binary would.

func TestWorkerCommandPrintsHelpAndVersionOnStdoutAndExitsZero(t *testing.T) {
	t.Parallel()
	out, errs, code := worker.Command([]string{"--help"}, ordersreport.Job)
	if code != 0 || !strings.HasPrefix(out, "w runs batchmr jobs (orders-report)") || !strings.Contains(out, "-concurrency") || errs != "" {
		t.Errorf("--help: exit %d, stdout %q, stderr %q; want 0, the usage and flags, nothing", code, out, errs)
	}
	out, errs, code = worker.Command([]string{"--version"}, ordersreport.Job)
	if code != 0 || !strings.HasPrefix(out, "w: batchmr ") || errs != "" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q; want 0, the version, nothing", code, out, errs)
	}
}

func TestWorkerCommandExitsTwoForABadCommandLineOrVariable(t *testing.T) {
	t.Setenv("WORKER_SHUTDOWN_TIMEOUT", "soon")
	_, errs, code := worker.Command(nil, ordersreport.Job)
	want := `w: WORKER_SHUTDOWN_TIMEOUT="soon" is not a duration: give one such as 30s (units ms, s, m, h), or unset it for that default (see --help)` + "\n"
	if code != 2 || errs != want {
		t.Errorf("a bad variable: exit %d, stderr %q; want 2, %q", code, errs, want)
	}
	t.Setenv("WORKER_SHUTDOWN_TIMEOUT", "10s")
	if _, errs, code := worker.Command([]string{"extra"}, ordersreport.Job); code != 2 || errs != "w: unexpected argument \"extra\" (see --help)\n" {
		t.Errorf("an argument: exit %d, stderr %q; want 2, unexpected argument", code, errs)
	}
}
