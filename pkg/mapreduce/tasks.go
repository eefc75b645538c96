package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
)

// The asynq task types of a run. Each task's ID is derived from the run
// (<run>:<nonce>:split, <run>:<nonce>:map:<index>, <run>:<nonce>:reduce),
// so enqueuing a task twice — a retried split, a duplicate reduce trigger —
// makes one task. The nonce is drawn when the run is created: a run started
// again under the same ID after the first one expired gets new task IDs,
// while asynq may still keep the first one's tasks.
const (
	TypeSplit  = "batchmr:split"
	TypeMap    = "batchmr:map"
	TypeReduce = "batchmr:reduce"
)

// Register routes the three task types to c on mux.
func (c *Client) Register(mux *asynq.ServeMux) {
	mux.Handle(TypeSplit, c)
	mux.Handle(TypeMap, c)
	mux.Handle(TypeReduce, c)
}

// ProcessTask makes Client an asynq.Handler for the task types above.
// Another type or a malformed payload is an error wrapping asynq.SkipRetry:
// asynq archives the task at once with that message instead of retrying
// what cannot succeed. A job this worker does not know is retried, since
// another worker may know it, and fails the run on the last attempt.
func (c *Client) ProcessTask(ctx context.Context, t *asynq.Task) error {
	switch t.Type() {
	case TypeSplit:
		return c.handleSplit(ctx, t)
	case TypeMap:
		return c.handleMap(ctx, t)
	case TypeReduce:
		return c.handleReduce(ctx, t)
	}
	return fmt.Errorf("mapreduce: task type %q is not batchmr's (%s, %s, %s): %w", t.Type(), TypeSplit, TypeMap, TypeReduce, asynq.SkipRetry)
}

// RetryDelay is an asynq.RetryDelayFunc that applies each job's
// JobOptions.Backoff to its tasks; other tasks get
// asynq.DefaultRetryDelayFunc. Set it as the worker's
// asynq.Config.RetryDelayFunc.
func (c *Client) RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	var p runPayload // map payloads carry the run too
	if json.Unmarshal(t.Payload(), &p) == nil {
		if job, ok := jobOf(p.Run); ok {
			if r, ok := c.jobs.lookup(job); ok && r.options().Backoff != nil {
				return r.options().Backoff(n, err)
			}
		}
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// runPayload is the payload of split and reduce tasks. Nonce ties the task
// to one incarnation of the run ID: a task left over from an earlier run
// under the same ID (re-run from asynq's archive, say) does nothing.
type runPayload struct {
	Run   string `json:"run"`
	Nonce string `json:"n"`
}

// mapPayload is the payload of a map task. A page the codec encoded as
// JSON travels as JSON, readable in asynq's tools; any other bytes as
// base64.
type mapPayload struct {
	Run       string          `json:"run"`
	Nonce     string          `json:"n"`
	Index     int             `json:"i"`
	Page      json.RawMessage `json:"page,omitempty"`
	PageBytes []byte          `json:"page_b,omitempty"` // may be empty: a codec may encode a page as no bytes
}

func (p *mapPayload) page() []byte {
	if p.Page != nil {
		return p.Page
	}
	return p.PageBytes
}

func taskID(run, nonce, step string) string { return run + ":" + nonce + ":" + step }

func mapTaskID(run, nonce string, i int) string {
	return run + ":" + nonce + ":map:" + strconv.Itoa(i)
}

// maxPages bounds a run: the recorded-pages bitmap of the largest run is
// 128 MiB.
const maxPages = 1 << 30

// malformed builds the error for a task that can never succeed.
func malformed(t *asynq.Task, why error) error {
	return fmt.Errorf("mapreduce: malformed %s task payload %.200q: %v: %w", t.Type(), t.Payload(), why, asynq.SkipRetry)
}

func decodeRunPayload(t *asynq.Task) (*runPayload, error) {
	var p runPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return nil, malformed(t, err)
	}
	if _, ok := jobOf(p.Run); !ok {
		return nil, malformed(t, fmt.Errorf("run ID %q is not <job>:<key>", p.Run))
	}
	return &p, nil
}

func decodeMapPayload(t *asynq.Task) (*mapPayload, error) {
	var p mapPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return nil, malformed(t, err)
	}
	if _, ok := jobOf(p.Run); !ok {
		return nil, malformed(t, fmt.Errorf("run ID %q is not <job>:<key>", p.Run))
	}
	if p.Index < 0 || p.Index >= maxPages {
		return nil, malformed(t, fmt.Errorf("page index %d is out of range [0, %d)", p.Index, maxPages))
	}
	return &p, nil
}

// runner finds the job of a run. A job this worker does not know may be
// known to another (a rolling deploy that adds a job): the error is
// retried like any other, and only on the task's last attempt does the run
// fail, with a message that names the job and the fix.
func (c *Client) runner(ctx context.Context, t *asynq.Task, run string) (jobRunner, error) {
	job, _ := jobOf(run)
	r, ok := c.jobs.lookup(job)
	if !ok {
		err := fmt.Errorf("mapreduce: %s task of run %s: job %q: %w on this worker (registered: %v); register it with AddJob on every worker",
			t.Type(), run, job, ErrUnknownJob, c.jobs.Names())
		if lastAttempt(ctx, err) {
			rctx, cancel := afterWork(ctx)
			defer cancel()
			c.failRun(rctx, run, err)
		}
		return nil, err
	}
	return r, nil
}

// enqueueStep enqueues the split or reduce task of a run; an existing task
// with that ID means it is already enqueued.
func (c *Client) enqueueStep(ctx context.Context, run, nonce, typ string, o JobOptions) error {
	payload, _ := json.Marshal(runPayload{Run: run, Nonce: nonce})
	step, timeout := "split", o.SplitTimeout
	if typ == TypeReduce {
		step, timeout = "reduce", o.ReduceTimeout
	}
	_, err := c.aq.EnqueueContext(ctx, asynq.NewTask(typ, payload),
		asynq.TaskID(taskID(run, nonce, step)), asynq.Queue(o.Queue), asynq.MaxRetry(o.StepRetries),
		asynq.Timeout(timeout), asynq.Retention(o.Retention))
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("enqueue %s of run %s: %w", step, run, err)
	}
	return nil
}

func (c *Client) enqueueMap(ctx context.Context, run, nonce string, i int, page []byte, o JobOptions) error {
	p := mapPayload{Run: run, Nonce: nonce, Index: i}
	// Only JSON-encoded pages travel as JSON: encoding/json compacts and
	// escapes a RawMessage, which would change another codec's bytes.
	if o.Codec == JSON {
		p.Page = page
	} else {
		p.PageBytes = page
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = c.aq.EnqueueContext(ctx, asynq.NewTask(TypeMap, payload),
		asynq.TaskID(mapTaskID(run, nonce, i)), asynq.Queue(o.Queue), asynq.MaxRetry(o.MapRetries),
		asynq.Timeout(o.MapTimeout))
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("enqueue page %d of run %s: %w", i, run, err)
	}
	return nil
}

// afterWork is the context of the Redis calls that record what a handler
// did. It outlives the task's own context: asynq archives a task whose
// deadline passed without waiting for its handler, so a record made with
// the expired context would be lost with it.
func afterWork(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

// lastAttempt reports whether the task's handler will not be retried after
// returning err.
func lastAttempt(ctx context.Context, err error) bool {
	if errors.Is(err, asynq.SkipRetry) {
		return true
	}
	var m *malformedError
	if errors.As(err, &m) {
		return true
	}
	retried, ok1 := asynq.GetRetryCount(ctx)
	max, ok2 := asynq.GetMaxRetry(ctx)
	return ok1 && ok2 && retried >= max
}
