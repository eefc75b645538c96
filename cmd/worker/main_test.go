package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// SIGTERM mid-run: the worker stops taking pages, lets its in-flight ones
// finish, gives its permits back (not after their leases: at once) and
// exits 0; another worker finishes the run with the right report.
func TestSIGTERMFinishesInFlightPagesReleasesPermitsAndExitsZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, ordersreport.Name)
	if err := ordersreport.Seed(ctx, pool, 20_000); err != nil {
		t.Fatal(err)
	}
	bin := testenv.Build(t, ".")
	dbURL := testenv.DatabaseURLIn(t, schema)
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "--db-permits", "2", "--concurrency", "4", "--shutdown-timeout", "20s",
			"--poll-interval", "20ms", "--log-format", "json")
		cmd.Env = append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t), "DATABASE_URL="+dbURL,
			"BATCHMR_PREFIX="+prefix)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 2, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()

	first := start()
	id, err := ordersreport.Job.Start(ctx, mr, ordersreport.Args{PageSize: 1000, SlowMS: 300}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var going string
	if !testenv.Eventually(30*time.Second, func() bool {
		st, _ := sem.Stats(ctx)
		run, _ := mr.Status(ctx, id)
		going = fmt.Sprintf("%+v %+v", st, run)
		return st.Held == 2 && run != nil && run.Done >= 1
	}) {
		t.Fatalf("the worker did not get going: %s", going)
	}
	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- first.Wait() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("worker after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not exit within its shutdown timeout")
	}
	if st, err := sem.Stats(ctx); err != nil || st.Held != 0 {
		t.Fatalf("permits after a clean exit: %+v, %v; want none held (not left to their leases)", st, err)
	}
	if st, _ := mr.Status(ctx, id); st.State.Ended() || st.Done == 20 {
		t.Fatalf("the run ended with the first worker: %+v; the test needs pages left", st)
	}

	start()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := mr.Wait(wctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ordersreport.Job.Result(st)
	if err != nil {
		t.Fatalf("run: %s (%s)", st.State, st.Error)
	}
	want, err := ordersreport.Expected(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Totals.Equal(want) || rep.Pages != 20 {
		t.Errorf("report %+v over %d pages, want %+v over 20", rep.Totals, rep.Pages, want)
	}
}

// Bad flags and environment values: one line naming the flag (not a
// library field) and what to use, exit 2, before connecting to anything.
func TestBadFlagsAreOneLineNamingTheFlagAndExitTwo(t *testing.T) {
	t.Parallel()
	bin := testenv.Build(t, ".")
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--db-permits", "0"}, "", "--db-permits 0: a semaphore needs at least 1 permit"},
		{[]string{"--permits", "cpu=-1"}, "", "--permits cpu=-1"},
		{[]string{"--permits", "cpu"}, "", "use NAME=N"},
		{[]string{"--reconcile-every", "-5s"}, "", "--reconcile-every -5s is negative"},
		{nil, "WORKER_RECONCILE_EVERY=-5s", "--reconcile-every -5s is negative"},
		{[]string{"--poll-interval", "-1s"}, "", "--poll-interval -1s is negative"},
		{[]string{"--shutdown-timeout", "-1s"}, "", "--shutdown-timeout -1s is negative"},
		{nil, "DB_PERMIT_LEASE=0s", "--lease 0 (env DB_PERMIT_LEASE): use a positive duration"},
		{[]string{"--poll-interval", "0"}, "", "--poll-interval 0 (env WORKER_POLL_INTERVAL): use a positive duration"},
		{[]string{"--concurrency", "0"}, "", "--concurrency 0: use at least 1"},
		{[]string{"--weight", "orders-report=x"}, "", "use NAME=N"},
		{[]string{"--weight", "nosuch=2"}, "", `--weight nosuch=2: this worker runs no job "nosuch" (it runs: orders-report)`},
		{nil, "WORKER_CONCURRENCY=abc", `WORKER_CONCURRENCY="abc" is not a whole number: give one such as 10`},
		{nil, "WORKER_SHUTDOWN_TIMEOUT=soon", `WORKER_SHUTDOWN_TIMEOUT="soon" is not a duration: give one such as 30s`},
		{[]string{"--log-level", "loud"}, "", `--log-level "loud" (env LOG_LEVEL): use debug, info, warn or error`},
		{nil, "LOG_LEVEL=warning", `--log-level "warning" (env LOG_LEVEL): use debug, info, warn or error`},
		{[]string{"--log-format", "xml"}, "", `--log-format "xml" (env LOG_FORMAT): use text or json`},
		{[]string{"stray"}, "", `unexpected argument "stray"`},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(os.Environ(), "REDIS_URL=redis://127.0.0.1:1/0", "DATABASE_URL=postgres://x@127.0.0.1:1/x")
		if tc.env != "" {
			cmd.Env = append(cmd.Env, tc.env)
		}
		out, err := cmd.CombinedOutput()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != 2 || !strings.Contains(string(out), tc.want) || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("worker %v %s: exit %d, %q; want exit 2 and one line saying %q", tc.args, tc.env, code, out, tc.want)
		}
	}
	// A good command line that cannot start: exit 1, one line, its
	// cause named once.
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "REDIS_URL=redis://127.0.0.1:1/0", "DATABASE_URL=postgres://x@127.0.0.1:1/x")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 ||
		!strings.Contains(string(out), "cannot reach the Redis server at 127.0.0.1:1") || strings.Contains(string(out), "worker: worker:") {
		t.Errorf("worker with Redis unreachable: %v, %q; want exit 1 and one line, prefixed once", err, out)
	}
	// orders-report queries Postgres: without a database the worker does
	// not start, rather than hand back every page it would take; a
	// setting that is missing exits 2, as REDIS_URL does.
	cmd = exec.Command(bin)
	cmd.Env = append(os.Environ(), "REDIS_URL=redis://127.0.0.1:1/0", "DATABASE_URL=")
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 ||
		!strings.Contains(string(out), "no database: pass --database-url or set DATABASE_URL") {
		t.Errorf("worker without a database: %v, %q; want exit 2 and one line naming the fix", err, out)
	}
	if out, err := exec.Command(bin, "--version").Output(); err != nil || !strings.HasPrefix(string(out), "worker: batchmr ") {
		t.Errorf("worker --version: %v, %q; want exit 0 and the batchmr version", err, out)
	}
	out, err = exec.Command(bin, "--help").Output()
	if err != nil || !strings.Contains(string(out), "Example") || !strings.Contains(string(out), "WORKER_RECONCILE_EVERY") || !strings.Contains(string(out), "orders-report") ||
		!strings.Contains(string(out), "--log-level") || !strings.Contains(string(out), "component=asynq") {
		t.Errorf("worker --help: %v\n%s", err, out)
	}
}
