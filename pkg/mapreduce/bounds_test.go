package mapreduce_test

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// textJob is a job whose arguments are a string, one page that maps to
// nothing, and whose Reduce returns what reduce makes of the arguments.
func textJob(name string, o mapreduce.JobOptions, reduce func(args string) string) mapreduce.Job[string, int, int, string] {
	return mapreduce.Job[string, int, int, string]{
		Name:  name,
		Split: func(_ context.Context, _ string, emit func(int) error) error { return emit(0) },
		Map:   func(context.Context, int) (int, error) { return 0, nil },
		Reduce: func(_ context.Context, args string, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (string, error) {
			for range pages {
			}
			return reduce(args), nil
		},
		Options: o,
	}
}

// A run keeps its arguments in Redis, where every reader of the run meets
// them: arguments over JobOptions.MaxArgsBytes (1 MiB by default) are
// refused from Go and from JSON, naming the option, and nothing is
// created; a job that raises the option takes larger ones.
func TestArgumentsOverMaxArgsBytesAreRefusedNamingTheOption(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	small := textJob("small", e.opts(mapreduce.JobOptions{AllowOverlap: true}), func(string) string { return "" })
	large := textJob("large", e.opts(mapreduce.JobOptions{AllowOverlap: true, MaxArgsBytes: 4 << 20}), func(string) string { return "" })
	e.addJob(mapreduce.AddJob(e.jobs, small))
	e.addJob(mapreduce.AddJob(e.jobs, large))
	host := e.client()
	starter, err := mapreduce.New(e.rdb, mapreduce.Config{Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	announce(t, starter, host)

	over := strings.Repeat("x", mapreduce.DefaultMaxArgsBytes) // with its quotes, 2 bytes over
	jsonOver, _ := json.Marshal(over)
	for what, start := range map[string]func() error{
		"Job.Start":           func() error { _, err := small.Start(ctx, host, over, mapreduce.StartOptions{}); return err },
		"StartJSON by a host": func() error { _, err := host.StartJSON(ctx, "small", jsonOver, mapreduce.StartOptions{}); return err },
		"StartJSON from the catalogue": func() error {
			_, err := starter.StartJSON(ctx, "small", jsonOver, mapreduce.StartOptions{})
			return err
		},
		"CheckJSON from the catalogue": func() error { return starter.CheckJSON(ctx, "small", jsonOver) },
		"Job.Start over a raised limit": func() error {
			_, err := large.Start(ctx, host, strings.Repeat("x", 4<<20), mapreduce.StartOptions{})
			return err
		},
	} {
		err := start()
		if !errors.Is(err, mapreduce.ErrInvalidArgs) || !strings.Contains(err.Error(), "MaxArgsBytes") || !strings.Contains(err.Error(), "reference") {
			t.Errorf("%s with arguments over the limit: %v; want ErrInvalidArgs naming MaxArgsBytes and the fix", what, err)
		}
	}
	for _, job := range []string{"small", "large"} {
		if runs, err := starter.Runs(ctx, job); err != nil || len(runs) != 0 {
			t.Errorf("refused starts created %d runs of %s (%v), want none", len(runs), job, err)
		}
	}

	// Up to the limit, and past the default where the job raised it.
	atLimit := strings.Repeat("x", mapreduce.DefaultMaxArgsBytes-2)
	if _, err := small.Start(ctx, host, atLimit, mapreduce.StartOptions{}); err != nil {
		t.Errorf("Job.Start with arguments of exactly MaxArgsBytes: %v", err)
	}
	twoMiB, _ := json.Marshal(strings.Repeat("y", 2<<20))
	id, err := starter.StartJSON(ctx, "large", twoMiB, mapreduce.StartOptions{})
	if err != nil {
		t.Fatalf("StartJSON of 2 MiB for a job with MaxArgsBytes 4 MiB: %v", err)
	}
	st, err := starter.Status(ctx, id)
	if err != nil || len(st.Args) != len(twoMiB) {
		t.Errorf("the run's arguments: %d bytes (%v), want the %d started with", len(st.Args), err, len(twoMiB))
	}

	bad := textJob("bad", e.opts(mapreduce.JobOptions{MaxArgsBytes: 64 << 20}), func(string) string { return "" })
	if err := mapreduce.AddJob(e.jobs, bad); err == nil || !strings.Contains(err.Error(), "MaxArgsBytes") {
		t.Errorf("AddJob with MaxArgsBytes 64 MiB: %v; want an error naming the option's ceiling", err)
	}
}

// A run's result stays in its record until its retention ends, as a
// page's does: a Reduce whose result is over 32 MiB encoded fails the run
// at once (a retry would make it as large again), naming the size and what
// to do instead.
func TestAReduceResultOverTheCapFailsTheRunNamingTheFix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var reduces atomic.Int32
	job := textJob("huge", e.opts(mapreduce.JobOptions{StepRetries: 3}), func(string) string {
		reduces.Add(1)
		return strings.Repeat("z", 33<<20)
	})
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 2)
	id, err := job.Start(context.Background(), c, "", mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 60*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, "result of Reduce is 33.0 MiB encoded, over the 32 MiB") ||
		!strings.Contains(st.Error, "store of your own") || len(st.Result) != 0 {
		t.Errorf("the run %s with error %q and a %d-byte result; want failed, naming the size, the cap and the fix", st.State, st.Error, len(st.Result))
	}
	if n := reduces.Load(); n != 1 {
		t.Errorf("Reduce ran %d times, want once: no retry makes its result smaller", n)
	}
}

// A run keeps the first 4 KiB of its error and of each failed page's, which
// every listing of runs and of failed pages reads.
func TestRunAndPageErrorsAreKeptToTheirFirst4KiB(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	huge := strings.Repeat("e", 100<<10)
	job := mapreduce.Job[string, int, int, string]{
		Name:    "loud",
		Split:   func(_ context.Context, _ string, emit func(int) error) error { return emit(0) },
		Map:     func(context.Context, int) (int, error) { return 0, errors.New(huge) },
		Options: e.opts(mapreduce.JobOptions{MapRetries: -1}),
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 1)
	id, err := job.Start(context.Background(), c, "", mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateFailed || len(st.Error) > 4<<10+len("…") || !strings.Contains(st.Error, "eeee") || !strings.HasSuffix(st.Error, "…") {
		t.Errorf("the run %s with a %d-byte error; want failed, its error cut to 4 KiB", st.State, len(st.Error))
	}
	failures, n, err := c.Failures(context.Background(), id, 0)
	if err != nil || n != 1 || len(failures[0].Error) != 4<<10+len("…") || !strings.HasSuffix(failures[0].Error, "eee…") {
		t.Errorf("the failed page: %d of them (%v), its error %d bytes; want one, its error the first 4 KiB", n, err, len(failures[0].Error))
	}
}
