//go:build linux

package faults_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/hibiken/asynq"
)

// archiveBound is how soon a task that can never run must be archived: an
// idle worker looks for tasks every 100 ms by default (--poll-interval),
// once a second by asynq's.
const archiveBound = 3 * time.Second

// Tasks that no batchmr step can run, enqueued into a job's queue — a type
// batchmr does not know under its prefix, one in the wrong case, one with
// a megabyte of payload, a map task whose payload is not one — are
// archived at once, without spending retries, with a short error that
// names the type (F5: they were retried instead); the job's runs go on.
func TestTasksNoStepCanRunAreArchivedAtOnceWithAClearError(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFleet(t, fleetConfig{})
		aq := asynq.NewClientFromRedisClient(f.redis.Client)
		insp := asynq.NewInspectorFromRedisClient(f.redis.Client)
		large := bytes.Repeat([]byte("x"), 1<<20)
		tasks := []struct{ typ, payload string }{
			{"batchmr:", `{}`},
			{"batchmr:MAP", `{"run":"sums:x","n":"x","i":0}`},
			{"batchmr:bogus", string(large)},
			{"batchmr:map", string(large)},
		}
		enqueued := time.Now()
		ids := make([]string, len(tasks))
		for i, tk := range tasks {
			info, err := aq.EnqueueContext(ctx, asynq.NewTask(tk.typ, []byte(tk.payload)), asynq.Queue(queue))
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = info.ID
		}
		a := defaultRun()
		id := f.start(a) // a run goes on alongside

		// When each was first seen archived, and what asynq last said of it.
		archived := make([]time.Time, len(tasks))
		infos := make([]*asynq.TaskInfo, len(tasks))
		waiting := len(tasks)
		testenv.Eventually(time.Until(enqueued.Add(20*time.Second)), func() bool {
			for i := range tasks {
				if !archived[i].IsZero() {
					continue
				}
				info, err := insp.GetTaskInfo(queue, ids[i])
				if err != nil {
					t.Fatalf("task %s: %v", ids[i], err)
				}
				if infos[i] = info; info.State == asynq.TaskStateArchived {
					archived[i] = time.Now()
					waiting--
				}
			}
			return waiting == 0
		}) // those never archived are reported below
		for i, tk := range tasks {
			info := infos[i]
			name := fmt.Sprintf("a %q task with %d bytes of payload", tk.typ, len(tk.payload))
			if archived[i].IsZero() {
				t.Errorf("a task no step can run is archived at once: %s is %s after %v, retried %d times (last error %.300q)",
					name, info.State, time.Since(enqueued).Round(time.Millisecond), info.Retried, info.LastErr)
				continue
			}
			took := archived[i].Sub(enqueued)
			t.Logf("%s: archived within %v of being enqueued, retried %d times: %s", name, took.Round(time.Millisecond), info.Retried, info.LastErr)
			if took > archiveBound || info.Retried > 0 {
				t.Errorf("a task no step can run is archived at once: %s was archived after %v and %d retries (bound %v, none)",
					name, took.Round(time.Millisecond), info.Retried, archiveBound)
			}
			if !strings.Contains(info.LastErr, tk.typ) || len(info.LastErr) > 1000 {
				t.Errorf("a task no step can run is archived with a short error naming its type: %s has the %d-byte error %.300q",
					name, len(info.LastErr), info.LastErr)
			}
		}
		st := f.finish(id, a, time.Now().Add(time.Minute), "a job's runs go on beside tasks no step can run")
		if st != nil && st.State.Ended() {
			f.checkPermitsFree(st.Finished)
		}
		f.checkPermits()
	})
}
