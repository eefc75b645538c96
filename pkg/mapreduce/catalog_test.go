package mapreduce_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// validatedSum registers a sum job with positiveArgs as its Validate, and
// returns a worker's client that runs it and a starter's that runs nothing.
func (e *env) validatedSum(o mapreduce.JobOptions) (host, starter *mapreduce.Client) {
	e.t.Helper()
	job := sumJob("sum", newCounts(), o)
	job.Validate = positiveArgs
	e.addJob(mapreduce.AddJob(e.jobs, job))
	starter, err := mapreduce.New(e.rdb, mapreduce.Config{Prefix: e.prefix})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.client(), starter
}

// announce runs c's announcer until the test ends, and waits until its
// first heartbeat is in the catalogue.
func announce(t *testing.T, starter, c *mapreduce.Client) (mapreduce.WorkerInfo, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	info := c.NewWorkerInfo()
	go func() {
		defer close(done)
		if err := c.Announce(ctx, info); err != nil {
			t.Errorf("Announce: %v", err)
		}
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	testenv.WaitFor(t, 5*time.Second, "the worker in the catalogue", func() bool {
		ws, _ := starter.Workers(context.Background())
		for _, w := range ws {
			if w.ID == info.ID {
				return true
			}
		}
		return false
	})
	return info, stop
}

// A worker lists the jobs it runs, with their queues and argument shapes;
// a process that runs none of them sees every job and who hosts it, and a
// worker that stops is withdrawn at once while its jobs stay listed.
func TestWorkersAnnounceTheirJobsAndWithdrawWhenTheyStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	host, starter := e.validatedSum(mapreduce.JobOptions{MapRetries: 7})
	if jobs, err := starter.Jobs(ctx); err != nil || len(jobs) != 0 {
		t.Fatalf("an empty catalogue: %v, %v", jobs, err)
	}
	if _, err := starter.Job(ctx, "sum"); !errors.Is(err, mapreduce.ErrUnknownJob) || !strings.Contains(err.Error(), "start a worker") {
		t.Errorf("a job nobody announced: %v", err)
	}
	w, stop := announce(t, starter, host)

	info, err := starter.Job(ctx, "sum")
	if err != nil {
		t.Fatal(err)
	}
	if info.Queue != e.prefix+":sum" || info.MapRetries != 7 || !info.JSON || !info.Validates || info.ArgsType != "mapreduce_test.sumArgs" {
		t.Errorf("announced job: %+v", info)
	}
	var schema struct {
		Properties map[string]struct{ Type string } `json:"properties"`
	}
	if err := json.Unmarshal(info.ArgsSchema, &schema); err != nil || schema.Properties["N"].Type != "integer" || schema.Properties["PageSize"].Type != "integer" {
		t.Errorf("argument schema %s (%v): want N and PageSize as integers", info.ArgsSchema, err)
	}
	if len(info.Workers) != 1 || info.Workers[0].ID != w.ID || info.Workers[0].Queues[e.prefix+":sum"] != 1 {
		t.Errorf("the job's workers: %+v, want the one announcer", info.Workers)
	}

	stop()
	if ws, err := starter.Workers(ctx); err != nil || len(ws) != 0 {
		t.Errorf("workers after the announcer stopped: %+v, %v; want none at once", ws, err)
	}
	info, err = starter.Job(ctx, "sum")
	if err != nil || len(info.Workers) != 0 {
		t.Errorf("the job after its worker stopped: %+v, %v; want listed, with no worker", info, err)
	}
}

// A process that does not have a job's Go code starts it from JSON: a live
// worker that runs the job checks the arguments first (its Validate and
// its type), so that a bad argument is refused before anything is created.
func TestStartJSONHasALiveHostCheckTheArgumentsBeforeCreatingTheRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	host, starter := e.validatedSum(e.opts(mapreduce.JobOptions{AllowOverlap: true}))
	if _, err := starter.StartJSON(ctx, "sum", json.RawMessage(`{"N": 10, "PageSize": 5}`), mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrUnknownJob) {
		t.Errorf("a job nobody announced: %v", err)
	}
	announce(t, starter, host)
	for _, tc := range []struct{ args, want string }{
		{`{"N": 10, "PageSize": -5}`, "PageSize -5: use at least 1"},
		{`{"N": 10, "PageSiz": 5}`, `unknown field "PageSiz"`},
		{`{"N": "ten"}`, "sumArgs"},
		{`{not json`, "not JSON"},
	} {
		start := time.Now()
		_, err := starter.StartJSON(ctx, "sum", json.RawMessage(tc.args), mapreduce.StartOptions{})
		if !errors.Is(err, mapreduce.ErrInvalidArgs) || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "invalid arguments") != 1 {
			t.Errorf("StartJSON(%s): %v; want ErrInvalidArgs saying %q once", tc.args, err, tc.want)
		}
		if err := starter.CheckJSON(ctx, "sum", json.RawMessage(tc.args)); !errors.Is(err, mapreduce.ErrInvalidArgs) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckJSON(%s): %v; want ErrInvalidArgs saying %q", tc.args, err, tc.want)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("StartJSON(%s) took %v to be refused, want at once", tc.args, took)
		}
	}
	if runs, err := starter.Runs(ctx, "sum"); err != nil || len(runs) != 0 {
		t.Fatalf("refused starts created %d runs (%v), want none", len(runs), err)
	}
	id, err := starter.StartJSON(ctx, "sum", json.RawMessage(` {"N": 10,  "PageSize": 5} `), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.worker(host, 2)
	if st := wait(t, starter, id, 30*time.Second); st.State != mapreduce.StateSucceeded || resultOf(t, starter, st) != 45 {
		t.Errorf("run started from JSON: %s %q", st.State, st.Error)
	}
}

// With no live worker to check them, a command-line start creates the run;
// its split checks the arguments before any page and fails the run at
// once, without spending retries, and its status says that its arguments
// were refused.
func TestArgumentsNobodyCheckedFailTheRunAtItsSplitWithoutRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	host, starter := e.validatedSum(e.opts(mapreduce.JobOptions{StepRetries: 5}))
	_, stop := announce(t, starter, host)
	stop() // listed, but nobody live to check
	id, err := starter.StartJSON(ctx, "sum", json.RawMessage(`{"N": 10, "PageSize": 0}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatalf("a start nobody can check: %v; want the run created", err)
	}
	e.worker(host, 1)
	st := wait(t, starter, id, 10*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, "PageSize 0: use at least 1") || st.Done+st.Failed != 0 {
		t.Errorf("run with invalid arguments: %s %q, %d pages; want failed at its split, naming the problem", st.State, st.Error, st.Done+st.Failed)
	}
	if !st.ArgsRefused() {
		t.Errorf("ArgsRefused() of the run failed by its arguments (%q) = false, want true: a retry would fail the same way", st.Error)
	}
	if ti := e.archivedTask(mapreduce.TypeSplit, id); ti.Retried != 0 {
		t.Errorf("the split was retried %d times, want none", ti.Retried)
	}
}

// A retired job leaves the catalogue by ForgetJob, but only once nothing
// depends on it: not while a live worker runs it (it would be announced
// again), nor while one of its runs has not ended. Its ended runs stay
// readable by ID.
func TestForgetJobRemovesARetiredJobOnlyOnceNoWorkerOrOpenRunNeedsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	host, starter := e.validatedSum(e.opts(mapreduce.JobOptions{}))
	info, stop := announce(t, starter, host)

	err := starter.ForgetJob(ctx, "sum")
	if err == nil || !strings.Contains(err.Error(), "live workers run it ("+info.ID+")") {
		t.Fatalf("forgetting a job a live worker runs: %v; want a refusal naming the worker", err)
	}
	stop()
	w := e.worker(host, 1)
	done, err := starter.StartJSON(ctx, "sum", json.RawMessage(`{"N": 10, "PageSize": 5}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := wait(t, starter, done, 10*time.Second); st.State != mapreduce.StateSucceeded {
		t.Fatalf("run %s, want succeeded", st.State)
	}
	w.Shutdown()
	open, err := starter.StartJSON(ctx, "sum", json.RawMessage(`{"N": 10, "PageSize": 5}`), mapreduce.StartOptions{Key: "open"})
	if err != nil {
		t.Fatal(err)
	}
	err = starter.ForgetJob(ctx, "sum")
	if err == nil || !strings.Contains(err.Error(), "1 of its runs have not ended ("+open+")") {
		t.Fatalf("forgetting a job with a run not ended: %v; want a refusal naming the run", err)
	}
	if _, err := starter.Job(ctx, "sum"); err != nil {
		t.Fatalf("after two refusals: %v; want the job still listed", err)
	}

	if err := starter.Cancel(ctx, open); err != nil {
		t.Fatal(err)
	}
	if err := starter.ForgetJob(ctx, "sum"); err != nil {
		t.Fatalf("forgetting a job nobody runs, its runs ended: %v", err)
	}
	if _, err := starter.Job(ctx, "sum"); !errors.Is(err, mapreduce.ErrUnknownJob) {
		t.Errorf("after ForgetJob, Job: %v; want ErrUnknownJob", err)
	}
	if st, err := starter.Status(ctx, done); err != nil || st.State != mapreduce.StateSucceeded {
		t.Errorf("a forgotten job's ended run: %v, %v; want it still readable", st, err)
	}
	if err := starter.ForgetJob(ctx, "sum"); !errors.Is(err, mapreduce.ErrUnknownJob) {
		t.Errorf("forgetting it again: %v; want ErrUnknownJob", err)
	}
}

// Two versions of a job's code under one name, as in the middle of a
// deploy that changed its arguments: the catalogue lists the workers that
// announce it other than its entry does, and none while they agree.
func TestTheCatalogueNamesWorkersThatRunAnotherVersionOfAJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	host, starter := e.validatedSum(mapreduce.JobOptions{})
	same := e.client() // the same code: the env's registry
	announce(t, starter, host)
	announce(t, starter, same)
	if info, err := starter.Job(ctx, "sum"); err != nil || len(info.Workers) != 2 || len(info.Disagree) != 0 {
		t.Fatalf("two workers of one version: %+v (%v); want both listed, none disagreeing", info, err)
	}

	type newArgs struct{ Count, PageSize int }
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, mapreduce.Job[newArgs, span, int, int]{
		Name:    "sum",
		Split:   func(context.Context, newArgs, func(span) error) error { return nil },
		Map:     func(context.Context, span) (int, error) { return 0, nil },
		Options: e.opts(mapreduce.JobOptions{}),
	}); err != nil {
		t.Fatal(err)
	}
	other, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: jobs, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	nw, stop := announce(t, starter, other)
	// The entry is the newest announcement, so either side may be the one
	// that disagrees with it, as each re-announces every few seconds.
	info, err := starter.Job(ctx, "sum")
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case info.ArgsType == "mapreduce_test.newArgs":
		if len(info.Disagree) != 2 || slices.Contains(info.Disagree, nw.ID) {
			t.Errorf("the entry is the new version's: %v disagree, want the two old workers", info.Disagree)
		}
	case len(info.Disagree) != 1 || info.Disagree[0] != nw.ID:
		t.Errorf("the entry is the old version's: %v disagree, want the new worker %s", info.Disagree, nw.ID)
	}
	stop()
	if info, err := starter.Job(ctx, "sum"); err != nil || len(info.Workers) != 2 || (info.ArgsType == "mapreduce_test.sumArgs" && len(info.Disagree) != 0) {
		t.Errorf("once the new version's worker stopped: %+v (%v)", info, err)
	}
}
