package main

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/internal/tests/testenv/testhost"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// These tests call Main in the test's own process, with buffers for its
// streams: no binary is built, and a command that fails returns its exit
// status instead of ending the test.

// mainOf runs the command line args as the scheduler binary would and
// returns its stdout, stderr and exit status.
func mainOf(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr strings.Builder
	code := Main(t.Context(), append([]string{"scheduler"}, args...), &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

func TestMainExitsTwoNamingAnUnknownCommand(t *testing.T) {
	t.Parallel()
	out, errs, code := mainOf(t, "bogus")
	if code != 2 || out != "" || errs != "scheduler: unknown command \"bogus\" (see --help)\n" {
		t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, the unknown command pointing at --help", code, out, errs)
	}
	if _, errs, code := mainOf(t); code != 2 || errs != "scheduler: missing command (see --help)\n" {
		t.Errorf("no command: exit %d, stderr %q; want 2, missing command", code, errs)
	}
}

func TestMainPrintsHelpOnStdoutAndExitsZero(t *testing.T) {
	t.Parallel()
	if out, errs, code := mainOf(t, "--help"); code != 0 || out != usage || errs != "" {
		t.Errorf("--help: exit %d, stdout %q, stderr %q; want 0, the usage, nothing", code, out, errs)
	}
	out, errs, code := mainOf(t, "run", "--help")
	if code != 0 || !strings.HasPrefix(out, runUsage) || !strings.Contains(out, "-wait") || errs != "" {
		t.Errorf("run --help: exit %d, stdout %q, stderr %q; want 0, run's usage and flags, nothing", code, out, errs)
	}
}

func TestMainExitsTwoForABadFlagWithTheCommandsHint(t *testing.T) {
	t.Parallel()
	_, errs, code := mainOf(t, "run", "job", "--page-size", "10")
	want := "scheduler: flag provided but not defined: -page-size: a job's arguments go in --args, as JSON: --args '{\"page_size\": 1000}' (see --help)\n"
	if code != 2 || errs != want {
		t.Errorf("exit %d, stderr %q; want 2, %q", code, errs, want)
	}
	// The hint is run's: another command that parses next does not get it.
	if _, errs, _ := mainOf(t, "status", "x", "--page-size", "10"); strings.Contains(errs, "--args") {
		t.Errorf("status with an unknown flag: %q; want no hint of run's", errs)
	}
}

// The prefix and Redis of the failing run's test are the process's
// (app.Prefix): it cannot run in parallel with a test that sets them too.
func TestMainExitsOneWhenTheRunItFollowsFails(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	saved := app.Prefix
	app.Prefix = prefix
	t.Cleanup(func() { app.Prefix = saved })
	job := mapreduce.Job[struct{}, int, int, int]{
		Name: "broken",
		Split: func(context.Context, struct{}, func(int) error) error {
			return errors.New("no table to split: broken on purpose")
		},
		Map: func(_ context.Context, p int) (int, error) { return p, nil },
		Reduce: func(context.Context, struct{}, iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			return 0, nil
		},
		Options: mapreduce.JobOptions{StepRetries: -1},
	}
	testhost.Host(t, rdb, testhost.Options{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)}, job)

	out, errs, code := mainOf(t, "run", "broken", "--wait", "--redis-url", testenv.RedisURL(t))
	if code != 1 || !strings.HasPrefix(out, "broken:") || !strings.Contains(errs, "broken on purpose") ||
		!strings.Contains(errs, "next: fix what failed it, then: scheduler retry ") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1, the run's ID, its error and what to do next", code, out, errs)
	}
	if _, errs, code := mainOf(t, "status", "broken:nosuchrun", "--redis-url", testenv.RedisURL(t)); code != 1 || !strings.HasPrefix(errs, "scheduler: ") || !isOneLine(errs) {
		t.Errorf("status of no run: exit %d, stderr %q; want 1 and one line", code, errs)
	}
}

// Ctrl-C while following a run (its context done) is 130, the run going on.
func TestMainExits130WhenCtrlCStopsFollowingARun(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	saved := app.Prefix
	app.Prefix = prefix
	t.Cleanup(func() { app.Prefix = saved })
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	job := mapreduce.Job[struct{}, int, int, int]{
		Name: "slow",
		Split: func(ctx context.Context, _ struct{}, _ func(int) error) error {
			select {
			case <-gate:
			case <-ctx.Done():
			}
			return nil
		},
		Map: func(_ context.Context, p int) (int, error) { return p, nil },
		Reduce: func(context.Context, struct{}, iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			return 0, nil
		},
	}
	testhost.Host(t, rdb, testhost.Options{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)}, job)

	// Ctrl-C comes as soon as the run's ID is printed, before it ends.
	ctx, ctrlC := context.WithCancel(t.Context())
	stdout := &onWrite{do: ctrlC}
	var stderr strings.Builder
	code := Main(ctx, []string{"scheduler", "run", "slow", "--wait", "--redis-url", testenv.RedisURL(t)}, stdout, &stderr)
	id := strings.TrimSpace(stdout.String())
	if code != 130 || !strings.HasSuffix(stderr.String(), "scheduler: stopped following "+id+" (the run goes on)\n") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 130 and that the run goes on", code, stdout.String(), stderr.String())
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := mr.Status(t.Context(), id); err != nil || st.State.Ended() {
		t.Errorf("the run after Ctrl-C: %v, %v; want it going on", st, err)
	}
}

// onWrite is a buffer that calls do at its first write.
type onWrite struct {
	strings.Builder
	do   func()
	once sync.Once
}

func (w *onWrite) Write(p []byte) (int, error) {
	w.once.Do(w.do)
	return w.Builder.Write(p)
}

func isOneLine(s string) bool {
	return strings.Count(s, "\n") == 1 && strings.HasSuffix(s, "\n")
}
