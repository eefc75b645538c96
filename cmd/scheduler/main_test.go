package main_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/testenv"
)

// scheduler builds the command once per test and runs it against the test
// Redis, under the test's own key prefix and queue.
type scheduler struct {
	t   *testing.T
	bin string
	env []string
}

func newScheduler(t *testing.T) *scheduler {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	queue := testenv.Queue(t, rdb, prefix)
	return &scheduler{t: t, bin: testenv.Build(t, "."), env: append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t),
		"BATCHMR_PREFIX="+prefix, "BATCHMR_QUEUE="+queue)}
}

// run runs the command and returns stdout, stderr and the exit code.
func (s *scheduler) run(args ...string) (string, string, int) {
	s.t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = s.env
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestRunStatusRunsCancelAndPermits(t *testing.T) {
	t.Parallel()
	s := newScheduler(t)
	// No worker: the run stays at its split.
	out, errs, code := s.run("run", "orders-report", "--args", `{"page_size": 100}`)
	if code != 0 || !strings.HasPrefix(out, "orders-report:") {
		t.Fatalf("run: %d %q %q", code, out, errs)
	}
	id := strings.TrimSpace(out)

	out, _, code = s.run("status", id, "--json")
	var st struct {
		ID, State string
		Total     int
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.ID != id || st.State != "splitting" || st.Total != -1 {
		t.Fatalf("status --json: %d %q (%v)", code, out, err)
	}
	if out, _, code = s.run("runs", "orders-report"); code != 0 || !strings.Contains(out, id) {
		t.Errorf("runs: %d %q", code, out)
	}
	if out, _, code = s.run("cancel", id); code != 0 || !strings.Contains(out, "cancelled") {
		t.Errorf("cancel: %d %q", code, out)
	}
	if out, _, _ = s.run("status", id); !strings.Contains(out, "cancelled") {
		t.Errorf("status after cancel: %q", out)
	}
	// The same key is one run.
	if _, errs, code := s.run("run", "orders-report", "--key", "tick-1"); code != 0 {
		t.Fatalf("run --key: %d %q", code, errs)
	}
	if out, errs, code := s.run("run", "orders-report", "--key", "tick-1"); code != 0 || !strings.Contains(errs, "already exists") || strings.TrimSpace(out) != "orders-report:tick-1" {
		t.Errorf("second run --key: %d %q %q", code, out, errs)
	}

	if out, _, code = s.run("permits", "set", "db", "5"); code != 0 || !strings.Contains(out, "limit 5") {
		t.Errorf("permits set: %d %q", code, out)
	}
	if out, _, code = s.run("permits", "get", "db"); code != 0 || !strings.Contains(out, "limit 5, held 0") {
		t.Errorf("permits get: %d %q", code, out)
	}
}

// Bad command lines and unreachable servers: one clear line, non-zero.
func TestBadInputGetsOneLineAndANonZeroExit(t *testing.T) {
	t.Parallel()
	s := newScheduler(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"run"}, 2, "missing JOB"},
		{[]string{"run", "orders-report", "--bogus"}, 2, "-bogus"},
		{[]string{"run", "no-such-job"}, 1, `"no-such-job"`},
		{[]string{"run", "orders-report", "--args", `{"slowms": 1}`}, 1, `unknown field "slowms"`},
		{[]string{"status", "not-a-run"}, 1, "<job>:<key>"},
		{[]string{"permits", "set", "db", "zero"}, 2, "whole number"},
		{[]string{"serve", "--schedule", "orders-report=@every 1ms"}, 2, "at least 1s"},
		{[]string{"serve", "--schedule", "nope=@daily"}, 2, `no job "nope"`},
		{[]string{"serve", "--schedule", "orders-report=@daily", "--args", `orders-report={"pagesize": 1}`}, 2, `unknown field "pagesize"`},
		{[]string{"status", "x:y", "--redis-url", "redis://127.0.0.1:1/0"}, 1, "does not answer"},
	} {
		_, errs, code := s.run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("scheduler %v: exit %d, stderr %q; want exit %d and one line saying %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"serve", "--help"}, {"permits", "--help"}} {
		out, _, code := s.run(args...)
		if code != 0 || !strings.Contains(out, "Example") {
			t.Errorf("scheduler %v: exit %d, no example in %q", args, code, out)
		}
	}
}

// Two replicas serving the same schedule start one run per tick: with a
// worker finishing each run before the next tick, three ticks make three
// runs, not six.
func TestTwoServingReplicasStartOneRunPerTick(t *testing.T) {
	t.Parallel()
	s := newScheduler(t)
	pool, schema := testenv.Postgres(t)
	if err := ordersreport.Seed(context.Background(), pool, 1000); err != nil {
		t.Fatal(err)
	}
	worker := testenv.Build(t, "../worker")
	dbURL := testenv.DatabaseURLIn(t, schema)
	w := exec.Command(worker, "--log-level", "error", "--poll-interval", "20ms")
	w.Env = append(s.env, "DATABASE_URL="+dbURL)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Process.Signal(os.Interrupt); _ = w.Wait() })

	var procs []*exec.Cmd
	for range 2 {
		cmd := exec.Command(s.bin, "serve", "--schedule", "orders-report=@every 1s")
		cmd.Env = s.env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	time.Sleep(3500 * time.Millisecond)
	for _, p := range procs {
		_ = p.Process.Signal(os.Interrupt)
		if err := p.Wait(); err != nil {
			t.Errorf("serve after SIGINT: %v", err)
		}
	}
	out, _, _ := s.run("runs", "orders-report")
	runs := strings.Split(strings.TrimSpace(out), "\n")[1:]
	if len(runs) < 3 || len(runs) > 4 {
		t.Fatalf("two replicas over ~3.5 ticks made %d runs, want 3 or 4 (one per tick):\n%s", len(runs), out)
	}
	tick := regexp.MustCompile(`^orders-report:\d{8}T\d{6}Z\s+succeeded`)
	for _, r := range runs {
		if !tick.MatchString(r) {
			t.Errorf("not a succeeded run named after its tick: %s", r)
		}
	}
}
