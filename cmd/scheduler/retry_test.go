package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// outageJob is sumJob whose pages starting at 11, 41 and 71 fail while
// down is set, without retries: a database outage in miniature.
func outageJob(name string, down *atomic.Bool) mapreduce.Job[sumArgs, [2]int, int, int] {
	j := sumJob(name, nil)
	sum := j.Map
	j.Map = func(ctx context.Context, p [2]int) (int, error) {
		if down.Load() && p[0]%30 == 11 {
			return 0, fmt.Errorf("pages %d-%d: connection refused", p[0], p[1])
		}
		return sum(ctx, p)
	}
	j.Options.MapRetries = -1
	return j
}

// A run that failed during an outage is resumed by 'scheduler retry
// --wait' once the outage is over: it says what runs again, follows the
// run and prints its result; status shows the retry. A run that succeeded
// or is still going, or that does not exist, is refused with the fix.
func TestRetryResumesAFailedRunAndRefusesRunsItCannotResume(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	var down atomic.Bool
	down.Store(true)
	held, _ := gate(t)
	f.host(nil, outageJob("sum", &down), sumJob("held", held))
	s := newScheduler(t, f)
	ctx := context.Background()

	out, errs, code := s.run("run", "sum", "--args", `{"n": 100, "page_size": 10}`, "--wait")
	id := strings.TrimSpace(out)
	if code != 1 || !strings.Contains(errs, id+" failed in") || !strings.Contains(errs, "\nnext: fix what failed it, then: scheduler retry "+id+" (") {
		t.Errorf("run --wait of a run that fails: exit %d, stdout %q, stderr %q; want exit 1, its ID, and scheduler retry named", code, out, errs)
	}
	if st, err := f.mr.Wait(ctx, id); err != nil || st.State != mapreduce.StateFailed || st.Failed != 3 {
		t.Fatalf("the run during the outage: %+v, %v; want failed with 3 failed pages", st, err)
	}
	if out, _, _ := s.run("status", id); !strings.Contains(out, "next     fix what failed it, then: scheduler retry "+id+" (") {
		t.Errorf("status of the failed run: %q; want it to name scheduler retry %s", out, id)
	}
	down.Store(false)
	out, errs, code = s.run("retry", id, "--wait")
	want := []string{"resuming " + id + " (failed): 3 of 10 pages run again (3 failed, 0 unfinished); 7 done pages are kept", "5050"}
	if got := lines(out); code != 0 || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("retry --wait: exit %d, stdout %q, stderr %q; want exit 0 and stdout %q", code, out, errs, want)
	}
	if !strings.Contains(errs, id+" succeeded in") || !strings.Contains(errs, "(since retry 1): 10/10 done") {
		t.Errorf("retry --wait: stderr %q does not say the run succeeded since its retry", errs)
	}
	if out, _, _ := s.run("status", id); !strings.Contains(out, "state    succeeded") || !strings.Contains(out, "(retry 1)") || strings.Contains(out, "next") {
		t.Errorf("status of the retried run: %q; want succeeded, retried once, and no next step", out)
	}
	out, _, _ = s.run("status", id, "--json")
	var st struct {
		Retries int       `json:"retries"`
		Retried time.Time `json:"retried"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Retries != 1 || st.Retried.IsZero() {
		t.Errorf("status --json of the retried run: %q (%v); want retries 1 and when", out, err)
	}

	if _, errs, code := s.run("retry", id); code != 1 || !oneLine(errs) || !strings.Contains(errs, "already succeeded") ||
		!strings.Contains(errs, "start a new run ('scheduler run sum')") {
		t.Errorf("retry of a succeeded run: exit %d, stderr %q; want exit 1 saying to start a new run", code, errs)
	}
	going, err := f.mr.StartJSON(ctx, "held", []byte(`{"n": 4, "page_size": 2}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := s.run("retry", going); code != 1 || !oneLine(errs) || !strings.Contains(errs, "has not ended") ||
		!strings.Contains(errs, "'scheduler cancel "+going+"' stops it") {
		t.Errorf("retry of a running run: exit %d, stderr %q; want exit 1 saying how to stop it", code, errs)
	}
	if _, errs, code := s.run("retry", "sum:nosuchkey"); code != 1 || !oneLine(errs) || !strings.Contains(errs, "run not found") ||
		!strings.Contains(errs, "'scheduler runs sum'") {
		t.Errorf("retry of an unknown run: exit %d, stderr %q; want exit 1 pointing at the list of runs", code, errs)
	}
	if _, errs, code := s.run("retry"); code != 2 || !oneLine(errs) || !strings.Contains(errs, "missing RUN") {
		t.Errorf("retry without a run: exit %d, stderr %q", code, errs)
	}
}

// A cancelled run is resumed by 'scheduler retry' without --wait: it says
// which pages run again and returns; the run finishes exactly.
func TestRetryResumesACancelledRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	held, open := gate(t)
	f.host(nil, sumJob("held", held))
	s := newScheduler(t, f)
	ctx := context.Background()

	id, err := f.mr.StartJSON(ctx, "held", []byte(`{"n": 4, "page_size": 2}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the split", func() bool { return f.state(id) == mapreduce.StateMapping })
	if _, errs, code := s.run("cancel", id); code != 0 {
		t.Fatalf("cancel: exit %d, stderr %q", code, errs)
	}
	out, errs, code := s.run("retry", id)
	if want := "resuming " + id + " (cancelled): 2 of 2 pages run again (0 failed, 2 unfinished); 0 done pages are kept"; code != 0 || strings.TrimSpace(out) != want {
		t.Fatalf("retry: exit %d, stdout %q, stderr %q; want exit 0 and %q", code, out, errs, want)
	}
	open()
	st, err := f.mr.Wait(ctx, id)
	if err != nil || st.State != mapreduce.StateSucceeded || string(st.Result) != "10" || st.Retries != 1 {
		t.Fatalf("the resumed run: %+v, %v; want succeeded with 10 after one retry", st, err)
	}
}

// A run that its job's Validate failed (started while no worker could
// check its arguments) is hinted a new run with other arguments, never a
// retry: a retry runs with the same arguments and fails the same way. The
// hint shows the refused arguments, quoted for the shell, to edit.
func TestARunFailedByItsArgumentsHintsANewRunNotARetry(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	_, stop := f.host(nil, sumJob("lost", nil))
	stop()
	s := newScheduler(t, f)

	p := s.start("run", "lost", "--args", `{"n": 5, "page_size": -1}`, "--wait")
	testenv.WaitFor(t, 10*time.Second, "the run to be created", func() bool { return len(lines(p.stdout.String())) == 1 })
	f.host(nil, sumJob("lost", nil))
	code := p.wait(30 * time.Second)
	id := strings.TrimSpace(p.stdout.String())
	hint := `its arguments were refused, and a retry would run with them again: fix them in a new run: scheduler run lost --args '{"n":5,"page_size":-1}'`
	if errs := p.stderr.String(); code != 1 || !strings.Contains(errs, "page_size -1: use at least 1") || !strings.Contains(errs, "next: "+hint) || strings.Contains(errs, "scheduler retry") {
		t.Errorf("run --wait of arguments Validate refuses: exit %d, stderr %q; want exit 1, the job's message and the hint %q, no retry", code, errs, hint)
	}
	out, errs, code := s.run("status", id)
	if code != 0 || !strings.Contains(out, "next     "+hint) || strings.Contains(out, "scheduler retry") {
		t.Errorf("status %s: exit %d, stdout %q, stderr %q; want the hint %q, no retry", id, code, out, errs, hint)
	}
	out, errs, code = s.run("retry", id)
	if !strings.Contains(errs, "warning: "+id+" failed because its job refused its arguments: unless the job's code has changed since, this retry fails the same way") {
		t.Errorf("retry %s: exit %d, stdout %q, stderr %q; want a warning that it fails the same way", id, code, out, errs)
	}
}
