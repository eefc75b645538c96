package mapreduce_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// A task of a job that no live worker announces and whose run does not
// exist (a typo, a retired job) can never run: it is archived at once,
// with an error naming the job and what to do, spending no retry, and
// logged once. While a live worker announces the job, or while its run
// exists, it is handed back as before.
func TestATaskOfAJobNobodyRunsWhoseRunDoesNotExistIsArchivedNamingTheJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("known", newCounts(), e.opts(mapreduce.JobOptions{}))))
	host, logs := e.loggedClient(slog.LevelWarn)
	ghost := asynq.NewTask(mapreduce.TypeSplit, []byte(`{"run":"ghost:20261127","n":"abc"}`))

	err := host.ProcessTask(ctx, ghost)
	if !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), `no live worker runs job "ghost" and the run does not exist`) ||
		!strings.Contains(err.Error(), "start a worker that runs it") {
		t.Errorf("a task of a job nobody runs, of no run: %v; want SkipRetry naming the job and the fix", err)
	}

	// A worker that runs the job may take it: handed back.
	ghosts := mapreduce.NewJobs()
	e.addJob(mapreduce.AddJob(ghosts, sumJob("ghost", newCounts(), e.opts(mapreduce.JobOptions{}))))
	other, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: ghosts, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	_, stop := announce(t, host, other)
	if err := host.ProcessTask(ctx, ghost); err == nil || errors.Is(err, asynq.SkipRetry) || host.IsFailure(err) {
		t.Errorf("the same task while a live worker runs its job: %v; want handed back", err)
	}
	stop()

	// Through a real server: archived at once, no retry spent.
	aq := asynq.NewClientFromRedisClient(e.rdb)
	t.Cleanup(func() { _ = aq.Close() })
	info, err := aq.Enqueue(ghost, asynq.Queue(e.queue), asynq.MaxRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	e.worker(host, 1)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	testenv.WaitFor(t, 10*time.Second, "the task archived", func() bool {
		ti, err := insp.GetTaskInfo(e.queue, info.ID)
		return err == nil && ti.State == asynq.TaskStateArchived
	})
	ti, _ := insp.GetTaskInfo(e.queue, info.ID)
	if ti.Retried != 0 || !strings.Contains(ti.LastErr, `job "ghost"`) {
		t.Errorf("archived after %d retries with %q; want at once, naming the job", ti.Retried, ti.LastErr)
	}
	var warned int
	for _, r := range logs.Records(t) {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "split") {
			warned++
			if msg != "mapreduce: split failed for good: it is not retried" || !strings.Contains(r["error"].(string), `job "ghost"`) {
				t.Errorf("logged %q (%v); want the split failed for good, naming the job", msg, r["error"])
			}
		}
	}
	if warned != 2 { // ProcessTask's, and the server's
		t.Errorf("%d warnings of the archived task, want 2: once each time it ran, never as a hand-back", warned)
	}
}

// A task of a type batchmr does not know is refused naming every type it
// does, and logged by its type, even an empty one.
func TestATaskOfAnUnknownTypeIsRefusedNamingEveryTaskType(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, logs := e.loggedClient(slog.LevelWarn)
	for _, typ := range []string{"batchmr:", "batchmr:bogus", ""} {
		err := c.ProcessTask(context.Background(), asynq.NewTask(typ, nil))
		if !errors.Is(err, asynq.SkipRetry) {
			t.Errorf("type %q: %v, want SkipRetry", typ, err)
			continue
		}
		for _, known := range []string{mapreduce.TypeSplit, mapreduce.TypeMap, mapreduce.TypePages, mapreduce.TypeReduce} {
			if !strings.Contains(err.Error(), known) {
				t.Errorf("type %q: %v; want it to name %s among batchmr's types", typ, err, known)
			}
		}
	}
	var msgs []string
	for _, r := range logs.Records(t) {
		msgs = append(msgs, r["msg"].(string))
	}
	want := []string{
		`mapreduce: task of unknown type "batchmr:" failed for good: it is not retried`,
		`mapreduce: task of unknown type "batchmr:bogus" failed for good: it is not retried`,
		`mapreduce: task of unknown type "" failed for good: it is not retried`,
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
}
