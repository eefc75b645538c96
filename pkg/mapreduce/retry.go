package mapreduce

import (
	"context"
	"errors"
	"fmt"
)

// Retry resumes a run that failed or was cancelled: its split runs again
// and enqueues only the pages not recorded — those that never finished, and
// those that failed for good, whose failures Retry forgets — then Reduce
// runs over every page. Pages that succeeded keep their results and are not
// processed again, and each page is still recorded once: the run draws a new
// nonce, which makes every task of its earlier attempt (a retry, a
// duplicate, an archived task re-run from asynq, a handler still at work)
// record nothing. Any process may call it: the job's options come from
// Config.Jobs or the catalogue.
//
// On success, returns nil; the run is splitting again, its keys do not
// expire until it ends again, and Status.Retries counts the retry. On
// failure, returns an error wrapping ErrRunNotFound, ErrRunNotEnded (the
// run is still going), ErrRunSucceeded (start a new run instead),
// ErrRunActive (the job forbids overlapping runs and another is active) or
// ErrUnknownJob, and leaves the run unchanged; except when only the enqueue
// of the split failed: the run is resumed, the error says so, and a
// worker's reconciler enqueues the split.
func (c *Client) Retry(ctx context.Context, runID string) error {
	k, err := c.ledger.keys(runID)
	if err != nil {
		return fmt.Errorf("mapreduce: retry: %w", err)
	}
	// A first look, so that a run that cannot be retried says why even
	// when its job is unknown; the script checks again.
	state, failed, err := c.ledger.stateOf(ctx, k)
	if err != nil {
		return fmt.Errorf("mapreduce: retry %s: %w", runID, err)
	}
	if err := notRetryable(runID, state); err != nil {
		if errors.Is(err, ErrRunSucceeded) && failed > 0 {
			// CompleteSemantics: Reduce ran over the pages that succeeded.
			return fmt.Errorf("mapreduce: retry %s: %w with %d failed pages, which its Reduce was given (the job's Semantics is CompleteSemantics): "+
				"a succeeded run is not run again; start a new run, or have Reduce return an error when pages failed, so that the run fails and Retry runs them again", runID, ErrRunSucceeded, failed)
		}
		return err
	}
	spec, err := c.specOf(ctx, runID)
	if err != nil {
		return fmt.Errorf("mapreduce: retry %s: %w", runID, err)
	}
	nonce := newNonce()
	outcome, detail, err := c.ledger.resume(ctx, k, runID, spec.o.AllowOverlap, nonce)
	if err != nil {
		return fmt.Errorf("mapreduce: retry %s: %w", runID, err)
	}
	switch outcome {
	case "missing":
		return notRetryable(runID, "")
	case "state":
		return notRetryable(runID, State(detail))
	case "active":
		return fmt.Errorf("mapreduce: retry %s: %w: %s (wait for it to end or cancel it, or set JobOptions.AllowOverlap)", runID, ErrRunActive, detail)
	}
	if err := c.enqueueStep(ctx, runID, nonce, typeSplit, spec.o); err != nil {
		return fmt.Errorf("mapreduce: retry %s: the run was resumed but its split could not be enqueued (a worker's reconciler will enqueue it): %w", runID, err)
	}
	return nil
}

// notRetryable returns the error of Retry for a run in state st ("" if it
// does not exist), or nil if the run may be retried.
func notRetryable(runID string, st State) error {
	switch st {
	case StateFailed, StateCancelled:
		return nil
	case "":
		return fmt.Errorf("mapreduce: retry %s: %w (never started, or expired after its retention)", runID, ErrRunNotFound)
	case StateSucceeded:
		return fmt.Errorf("mapreduce: retry %s: %w: only a failed or cancelled run has pages to run again; start a new run", runID, ErrRunSucceeded)
	default:
		return fmt.Errorf("mapreduce: retry %s: %w (it is %s): wait for it to end, or cancel it first", runID, ErrRunNotEnded, st)
	}
}

// specOf returns the spec of a run's job: a job this process runs, or one
// of the catalogue.
func (c *Client) specOf(ctx context.Context, runID string) (jobSpec, error) {
	job, _ := jobOf(runID)
	if r, ok := c.jobs.lookup(job); ok {
		return c.spec(job, r.options()), nil
	}
	info, err := c.Job(ctx, job)
	if err != nil {
		return jobSpec{}, err
	}
	return info.spec(), nil
}
