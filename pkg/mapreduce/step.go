package mapreduce

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Every handler of a run's task begins the same way: its payload names the
// run and the nonce the task was enqueued under, the run's job must be one
// this worker runs (beginStep), and its first read of the run's record
// claims the task in the same round trip (readRun; pageState for a map
// task) and tells whether the run still wants the task. What a handler
// does then is its own: split.go, map.go, reduce.go.

// step is a task of a run as its handler begins it.
type step struct {
	name  string // the step in errors: "split", "reduce", or a map task's pages (pagesName)
	runID string
	nonce string // the task's: the incarnation of the run ID it was enqueued for
	r     jobRunner
	o     JobOptions
	k     runKeys
}

// beginStep begins task t, named name, of run under nonce: it finds the
// run's job, and returns runner's error for a job this worker does not
// run (handed back, or archived if no worker could ever run it).
func (c *Client) beginStep(ctx context.Context, t *asynq.Task, name, runID, nonce string) (*step, error) {
	r, err := c.runner(ctx, t, runID)
	if err != nil {
		return nil, err
	}
	k, _ := c.ledger.keys(runID) // decodeRunPayload and decodeMapPayload checked the run ID
	return &step{name: name, runID: runID, nonce: nonce, r: r, o: c.options(r), k: k}, nil
}

// beginRunStep is beginStep for a split or reduce task: it decodes the
// task's payload first, and returns an error that archives the task if it
// is malformed.
func (c *Client) beginRunStep(ctx context.Context, t *asynq.Task) (*step, error) {
	p, err := decodeRunPayload(t)
	if err != nil {
		return nil, err
	}
	return c.beginStep(ctx, t, stepName(t), p.Run, p.Nonce)
}

// errorf returns an error of the step: "mapreduce: <name> of <run>: "
// followed by format, formatted as fmt.Errorf does.
func (s *step) errorf(format string, a ...any) error {
	return fmt.Errorf("mapreduce: %s of %s: "+format, append([]any{s.name, s.runID}, a...)...)
}

// readRun reads fields of the run's record for its step s, claiming the
// task, as ledger.readRun does; current reports whether the run is in
// state under the task's nonce.
func (c *Client) readRun(ctx context.Context, s *step, state State, also func(context.Context, redis.Pipeliner), fields ...string) (rec runRecord, current bool, err error) {
	rec, current, err = c.ledger.readRun(ctx, s.k, s.r.name(), s.nonce, state, also, fields...)
	if err != nil {
		return nil, false, s.errorf("%w", err)
	}
	return rec, current, nil
}

// stepFailed returns what a split or reduce whose work failed with err
// gives asynq: a transient retry while it has those (transientRetry); err,
// for asynq to retry, until its last attempt (lastAttempt); then, once
// fail has ended the run as failed, final(err), joined with fail's error
// if it could not.
func (c *Client) stepFailed(ctx, rctx context.Context, s *step, err error, fail func(err error) error) error {
	if tr := c.transientRetry(rctx, s.k, s.name, err, s.o); tr != nil {
		return tr
	}
	if !lastAttempt(ctx, err, s.o.StepRetries) {
		return err
	}
	if ferr := fail(err); ferr != nil {
		return errors.Join(err, ferr)
	}
	return final(err)
}

// runEnded reports whether cause, the cause of a context watchRun
// returned, says the run ended while the step worked: it was cancelled,
// or failed.
func runEnded(cause error) bool {
	return errors.Is(cause, ErrRunCancelled) || errors.Is(cause, ErrRunEnded)
}
