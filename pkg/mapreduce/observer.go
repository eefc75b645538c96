package mapreduce

import (
	"context"
	"time"

	"github.com/hibiken/asynq"
)

// StepKind names a step of a run.
type StepKind string

// The steps of a run, as an Observer sees them.
const (
	StepSplit  StepKind = "split"
	StepMap    StepKind = "map" // one page
	StepReduce StepKind = "reduce"
)

// Step is one attempt of a step of a run that really starts work: not a
// duplicate delivery, not a task of a run that has ended or of an earlier
// run under the same ID.
type Step struct {
	Kind StepKind
	Job  string
	Run  string
	// Page is the page's index for StepMap, -1 otherwise.
	Page int
	// Attempt counts the step's attempts from 1 (asynq's retry count + 1);
	// 0 when asynq did not say.
	Attempt int
	// TaskID is the asynq task's ID.
	TaskID string
}

// An Observer learns of the work a Client's handlers do and of the runs it
// ends, for metrics and tracing (packages metrics and mrotel implement it).
// Its methods are called from the handlers' goroutines, concurrently, and
// must return quickly: a slow Observer slows the step it observes.
type Observer interface {
	// Step is called when a step starts work in this process. The step
	// runs with the context it returns (return ctx itself when there is
	// nothing to add; a tracer returns one carrying its span), and the
	// function it returns is called once, when the step's work is over,
	// with its outcome: nil if the step succeeded (a page recorded its
	// result, a split enqueued every page, a reduce recorded the run's
	// outcome), an error wrapping ErrRunCancelled or ErrRunEnded if the
	// run ended while the step worked, and otherwise the error the step
	// returned to asynq (an attempt that failed, whether or not it will
	// be retried: errors.Is(err, asynq.SkipRetry) reports that it will not).
	Step(ctx context.Context, s Step) (context.Context, func(err error))
	// RunEnded is called once per run outcome, in the process that
	// recorded it (one process fleet-wide: a run ends once), with how long
	// the run took from its creation, or from its last Retry, to its end.
	// Cancel ends runs too: a process that cancels runs calls RunEnded for
	// them if its Client has an Observer.
	RunEnded(job, runID string, state State, took time.Duration)
}

// startStep tells the Observer that a step starts work, and returns the
// context to run it with and the function to call with its handler's
// error. The run's end while the step worked (the cause of ctx after the
// step, as watchRun sets it) is reported as the outcome of a step that
// returned nil.
func (c *Client) startStep(ctx context.Context, kind StepKind, runID string, page int) (context.Context, func(ctx context.Context, err error)) {
	o := c.cfg.Observer
	if o == nil {
		return ctx, func(context.Context, error) {}
	}
	job, _ := jobOf(runID)
	s := Step{Kind: kind, Job: job, Run: runID, Page: page}
	if n, ok := asynq.GetRetryCount(ctx); ok {
		s.Attempt = n + 1
	}
	s.TaskID, _ = asynq.GetTaskID(ctx)
	ctx, done := o.Step(ctx, s)
	return ctx, func(wctx context.Context, err error) {
		if err == nil {
			if cause := context.Cause(wctx); runEnded(cause) {
				err = cause
			}
		}
		if done != nil {
			done(err)
		}
	}
}

// observeEnd tells the Observer that this process ended run in state.
func (c *Client) observeEnd(ctx context.Context, runID string, state State) {
	o := c.cfg.Observer
	if o == nil {
		return
	}
	job, _ := jobOf(runID)
	var took time.Duration
	// One more round trip, only with an Observer: finish.lua does not
	// return when the run began.
	if began := c.ledger.began(ctx, runID); !began.IsZero() {
		took = max(time.Since(began), 0)
	}
	o.RunEnded(job, runID, state, took)
}

// Observers returns an Observer that tells each of obs in turn (nil ones
// are skipped): a step runs with the context the last of them returned,
// each having seen the context of the one before, and its end is told to
// them in the reverse order, as nested spans end. With none it returns
// nil; with one, that one.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Step(ctx context.Context, s Step) (context.Context, func(err error)) {
	ends := make([]func(error), len(m))
	for i, o := range m {
		ctx, ends[i] = o.Step(ctx, s)
	}
	return ctx, func(err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](err)
		}
	}
}

func (m multiObserver) RunEnded(job, runID string, state State, took time.Duration) {
	for _, o := range m {
		o.RunEnded(job, runID, state, took)
	}
}
