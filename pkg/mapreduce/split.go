package mapreduce

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// handleSplit runs the job's Split and enqueues a map task per page (or
// per group of cheap pages: pack.go) while the run's window has room
// (window.go). A split that starts again —
// a retry, a copy of an orphaned split, or a split handed on by one that
// ran long — first enqueues again the pages the last feed stored (their
// task IDs make that a no-op while their tasks exist), then goes on after
// the last page fed: Split resumes from that page's cursor (ResumeSplit),
// or runs from the start and the pages already fed are skipped by
// position. Only when every page is enqueued does it write the total,
// which is what lets the last recorded page trigger the reduce.
func (c *Client) handleSplit(ctx context.Context, t *asynq.Task) (err error) {
	s, err := c.beginRunStep(ctx, t)
	if err != nil {
		return err
	}
	var recorded *redis.StringCmd
	rec, current, err := c.readRun(ctx, s, StateSplitting, func(ctx context.Context, p redis.Pipeliner) {
		recorded = p.Get(ctx, s.k.recorded)
	}, append([]string{"args"}, windowFields...)...)
	if err != nil || !current {
		return err // nil: already split, ended, expired, or a task of an earlier run under this ID
	}
	ctx, endStep := c.startStep(ctx, StepSplit, s.runID, -1)
	defer func() { endStep(ctx, err) }()
	ctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, s.runID), s.runID)
	defer stop()

	f := c.newFeeder(ctx, s, rec, []byte(recorded.Val()))
	n, splitErr, stopped := f.split(ctx, s.r, []byte(rec["args"]))
	if runEnded(context.Cause(ctx)) {
		return nil // the run ended while splitting: nothing more to do
	}
	if handedOn(stopped) {
		return nil // a new split task goes on; or the run has moved on without this one
	}
	if splitErr == nil {
		splitErr = stopped // an enqueue failed, or nil
	}
	rctx, cancel := afterWork(ctx)
	defer cancel()
	if splitErr != nil {
		return c.splitFailed(ctx, rctx, s, n, splitErr)
	}
	return c.splitDone(rctx, s, n)
}

// splitFailed returns what a split whose Split, or feeding, failed with
// splitErr after n pages gives asynq (stepFailed), and fails the run on
// the split's last attempt.
func (c *Client) splitFailed(ctx, rctx context.Context, s *step, n int, splitErr error) error {
	err := fmt.Errorf("mapreduce: split of %s after %d pages: %w", s.runID, n, splitErr)
	var m *malformedError
	if errors.As(splitErr, &m) { // arguments no retry can fix (Status.ArgsRefused)
		err = s.errorf("%w", splitErr)
	}
	return c.stepFailed(ctx, rctx, s, err, func(err error) error {
		c.failRun(rctx, s.runID, s.nonce, err)
		return nil
	})
}

// splitDone records the total of a split whose n pages are all fed
// (splitdone.lua), and enqueues the reduce if every page is recorded
// already; from then on the last page recorded enqueues it. A Split that
// emitted fewer pages than an earlier attempt had recorded fails the run:
// Split must be deterministic.
func (c *Client) splitDone(ctx context.Context, s *step, n int) error {
	st, err := c.ledger.recordTotal(ctx, s.k, n, s.nonce)
	if err != nil {
		return s.errorf("recording the total of %d pages: %w", n, err)
	}
	switch {
	case st == "nondeterministic":
		err := fmt.Errorf("mapreduce: split of %s: Split emitted %d pages, but an earlier attempt emitted more and they were recorded: "+
			"Split must emit the same pages in the same order every time it runs: %w", s.runID, n, asynq.SkipRetry)
		c.failRun(ctx, s.runID, s.nonce, err)
		return err
	case State(st) == StateReducing:
		return c.enqueueStep(ctx, s.runID, s.nonce, typeReduce, s.o)
	}
	return nil
}

// failRun ends a run as failed with err's message, unless it has ended or
// Retry has resumed it since (nonce).
func (c *Client) failRun(ctx context.Context, runID, nonce string, err error) {
	if _, _, ferr := c.finish(ctx, runID, nonce, StateFailed, nil, err.Error(), ""); ferr != nil {
		Logger(ctx).Error("mapreduce: could not mark the run failed; the reconciler will retry", "reason", err, "error", ferr)
	}
}

// str returns v if it is a string, and "" otherwise (a missing field).
func str(v any) string {
	s, _ := v.(string)
	return s
}
