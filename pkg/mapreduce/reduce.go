package mapreduce

import (
	"context"
	"fmt"
	"strconv"

	"github.com/hibiken/asynq"
)

// handleReduce runs Reduce over every recorded page and ends the run. Only
// a run in the reducing state is reduced, and only the first outcome is
// recorded: a duplicate reduce task, or one that overlapped a slow first
// one, cannot change the result.
func (c *Client) handleReduce(ctx context.Context, t *asynq.Task) (err error) {
	s, err := c.beginRunStep(ctx, t)
	if err != nil {
		return err
	}
	rec, current, err := c.readRun(ctx, s, StateReducing, nil, "args", "total", "failed", "packed")
	if err != nil || !current {
		return err // nil: ended already, expired, or a task of an earlier run under this ID
	}
	total, failedPages := atoi(rec["total"]), atoi(rec["failed"])
	per, perr := strconv.Atoi(rec["packed"])
	if perr != nil || per < 1 || per > 256 {
		msg := fmt.Sprintf("the run's record says its small results are bundled %q pages to a field; batchmr bundles 1 to 256 and writes it when the run starts: the record was changed by something other than batchmr", rec["packed"])
		return c.end(ctx, s, StateFailed, nil, msg)
	}
	ctx, endStep := c.startStep(ctx, StepReduce, s.runID, -1)
	stepCtx := ctx // the reduce's watched context, once it has one
	defer func() { endStep(stepCtx, err) }()
	pages := c.ledger.storedPages(ctx, s.k, total, per, failedPages)
	rctx, cancel := afterWork(ctx)
	defer cancel()

	if failedPages > 0 && s.r.options().Semantics == SuccessSemantics {
		msg, err := c.ledger.describeFailures(ctx, s.k, total, failedPages)
		if err != nil {
			return s.errorf("%w", err)
		}
		return c.end(rctx, s, StateFailed, nil, msg)
	}
	if !s.r.hasReduce() {
		return c.end(rctx, s, StateSucceeded, nil, "")
	}
	wctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, s.runID), s.runID)
	stepCtx = wctx
	result, err := s.r.reduce(wctx, []byte(rec["args"]), pages)
	stop()
	if err == nil {
		err = c.checkRunResultSize(ctx, len(result))
	}
	switch {
	case err != nil && runEnded(context.Cause(wctx)):
		return nil
	case err != nil:
		return c.stepFailed(ctx, rctx, s, s.errorf("%w", err), func(err error) error {
			return c.end(rctx, s, StateFailed, nil, err.Error())
		})
	}
	return c.end(rctx, s, StateSucceeded, result, "")
}

// end finishes a reducing run, unless Retry has resumed it since (the
// step's nonce).
func (c *Client) end(ctx context.Context, s *step, to State, result []byte, msg string) error {
	if _, _, err := c.finish(ctx, s.runID, s.nonce, to, result, msg, StateReducing); err != nil {
		return s.errorf("recording the outcome: %w", err)
	}
	return nil
}
