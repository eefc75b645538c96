package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/internal/drain"
	"github.com/batchmr/batchmr/internal/shorten"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
)

// handleMap runs Map for the pages of a map task — one, or a pack's group
// (pack.go) — one after another, and records their outcomes in one call.
// A page already recorded, or of a run that no longer takes results, is
// not processed again. A failed page is returned to asynq, which retries
// the task: the pages recorded meanwhile are skipped then. On a page's
// last attempt it is recorded as failed, so that the run can go on.
func (c *Client) handleMap(ctx context.Context, t *asynq.Task) error {
	p, err := decodeMapPayload(t)
	if err != nil {
		return err
	}
	pages := p.parts()
	first := pages[0].i
	s, err := c.beginStep(ctx, t, pagesName(first, pages[len(pages)-1].i), p.Run, p.Nonce)
	if err != nil {
		return err
	}
	// Watched from before the state check: a Cancel that lands after the
	// check reaches this Map within one CancelPoll.
	wctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, s.runID), s.runID)
	defer stop()
	todo, err := c.pagesToMap(ctx, s, pages)
	if err != nil || len(todo) == 0 {
		return err
	}
	m, ended := c.mapPages(ctx, wctx, s, todo, t.Type() == typePages)
	if ended {
		return nil // the run ended while its pages were processed
	}
	stop()
	return c.recordPages(ctx, s, first, m)
}

// pagesToMap reads the run's state and which of pages are recorded
// (pageState), and returns those to map: none if the task is of an
// earlier run under its ID, the run ended or expired, or every page is
// recorded (a duplicate delivery). A run that is reducing has every page
// recorded, perhaps by a handler that died before enqueuing the reduce:
// pagesToMap makes sure the reduce is enqueued.
func (c *Client) pagesToMap(ctx context.Context, s *step, pages []fedPage) ([]fedPage, error) {
	state, nonce, recorded, err := c.ledger.pageState(ctx, s.k, pages[0].i, pages[len(pages)-1].i, s.r.name())
	if err != nil {
		return nil, s.errorf("%w", err)
	}
	switch {
	case nonce != s.nonce:
		return nil, nil // a task of an earlier run under this ID, or the run expired
	case state == StateReducing:
		return nil, c.enqueueStep(ctx, s.runID, nonce, typeReduce, s.o)
	case state != StateSplitting && state != StateMapping:
		return nil, nil // ended, or expired
	}
	return recorded.unrecorded(pages), nil
}

// mapped is what became of a map task's pages in this attempt.
type mapped struct {
	outcomes []pageOutcome       // the pages Map succeeded for
	failures []pageFailure       // those it failed for
	unrun    []fedPage           // those the task's context ended before
	ends     map[int]func(error) // each page's Observer step
	mapUS    int64               // how long Map took over outcomes
}

// mapPages runs Map for each of pages in turn (mapOne), with the run's
// watched context wctx, until the task's context ctx ends. If the run
// ends meanwhile (ended), it ends the pages' Observer steps: none of them
// is recorded.
func (c *Client) mapPages(ctx, wctx context.Context, s *step, pages []fedPage, packed bool) (m *mapped, ended bool) {
	m = &mapped{ends: make(map[int]func(error), len(pages))}
	for n, pg := range pages {
		if ctx.Err() != nil {
			// asynq's deadline, or a shutdown: the pages not started are
			// not failures of theirs; the task's retry runs them.
			m.unrun = pages[n:]
			break
		}
		result, took, end, err := c.mapOne(wctx, s.r, s.runID, pg, packed, s.o)
		m.ends[pg.i] = end
		if cause := context.Cause(wctx); runEnded(cause) {
			for _, end := range m.ends {
				end(cause)
			}
			return nil, true
		}
		if err != nil {
			m.failures = append(m.failures, pageFailure{pg, fmt.Errorf("mapreduce: page %d of %s: %w", pg.i, s.runID, err)})
			continue
		}
		m.mapUS += took.Microseconds()
		m.outcomes = append(m.outcomes, pageOutcome{i: pg.i, outcome: result})
	}
	return m, false
}

// recordPages records what became of a map task's pages (m) in one call,
// after deciding which failures are final (settleFailures), ends each
// page's Observer step, and returns the task's error: nil, a failure to
// retry, or the final failure, for which asynq archives the task. A task
// whose outcomes could not be recorded runs again, whatever failed: the
// pages that succeeded are recorded then, not lost with it. first is the
// task's first page.
func (c *Client) recordPages(ctx context.Context, s *step, first int, m *mapped) error {
	measured := len(m.outcomes)
	rctx, cancel := afterWork(ctx)
	defer cancel()
	finals, retry, mapErr := c.settleFailures(ctx, rctx, s.k, first, m.failures, s.o)
	if len(m.unrun) > 0 {
		// Not final, whatever else failed (so the others' errors are
		// text only): the task must run again.
		notRun := fmt.Errorf("mapreduce: %s of %s not run: %w", pagesName(m.unrun[0].i, m.unrun[len(m.unrun)-1].i), s.runID, context.Cause(ctx))
		if mapErr != nil {
			notRun = fmt.Errorf("%w (and: %v)", notRun, mapErr)
		}
		mapErr = notRun
	}
	outcomes := m.outcomes
	for _, f := range finals {
		b, _ := json.Marshal(failure{Page: f.page.page, Error: shorten.To(f.err.Error(), errorMax)})
		outcomes = append(outcomes, pageOutcome{i: f.page.i, outcome: b, failed: true, err: f.err})
	}
	var st State
	var err error
	if len(outcomes) > 0 {
		err = withRedis(rctx, c.outages, "recording pages", func(ctx context.Context) (err error) {
			st, err = c.ledger.record(ctx, s.k, s.nonce, outcomes, m.mapUS, measured, c.ledger.claimOf(ctx, s.r.name()))
			return err
		})
	}
	m.endSteps(outcomes, retry, err, mapErr)
	if err != nil {
		err = s.errorf("recording the outcome: %w", err)
		if mapErr != nil {
			err = fmt.Errorf("%w (and: %v)", err, mapErr)
		}
		return err
	}
	if st == StateReducing {
		if err := c.enqueueStep(rctx, s.runID, s.nonce, typeReduce, s.o); err != nil {
			return s.errorf("%w", err)
		}
	}
	return mapErr
}

// endSteps ends each page's Observer step with what became of it: the
// pages recorded (outcomes) with recordErr if recording failed, else nil
// or the page's final failure; the pages that run again with the task
// (retry) with their error, as the task's error (mapErr) retries them.
func (m *mapped) endSteps(outcomes []pageOutcome, retry []pageFailure, recordErr, mapErr error) {
	for _, o := range outcomes {
		switch {
		case recordErr != nil:
			m.ends[o.i](recordErr)
		default:
			m.ends[o.i](o.err) // nil, or the page's final failure
		}
	}
	for _, f := range retry {
		switch tr, ok := errors.AsType[*errTransientRetry](mapErr); {
		case ok:
			m.ends[f.page.i](&errTransientRetry{err: f.err, attempt: tr.attempt, delay: tr.delay})
		case errors.Is(mapErr, errStopping):
			m.ends[f.page.i](fmt.Errorf("%w: %w", errStopping, f.err))
		default:
			m.ends[f.page.i](f.err)
		}
	}
}

// pageOutcome is what record stores of page i: its encoded result, or its
// encoded failure if failed, whose error err is (for the page's Observer
// step).
type pageOutcome struct {
	i       int
	outcome []byte
	failed  bool
	err     error
}

// pageFailure is a page whose Map failed in this attempt, with its error.
type pageFailure struct {
	page fedPage
	err  error
}

// mapOne runs Map for page pg of a run with its own context: the page's
// index, and in a task of several pages (packed) its own logger attribute
// and MapTimeout, which asynq's deadline sets for a task of one. It
// returns Map's result, checked for size, how long Map took, the function
// that ends the page's Observer step with what became of the page, and
// Map's error.
func (c *Client) mapOne(wctx context.Context, r jobRunner, runID string, pg fedPage, packed bool, o JobOptions) (result []byte, took time.Duration, end func(error), err error) {
	ctx := context.WithValue(wctx, pageIndexKey, pg.i)
	cancel := context.CancelFunc(func() {})
	if packed {
		ctx = ContextWithLogger(ctx, withPage(Logger(ctx), pg.i))
		ctx, cancel = context.WithTimeout(ctx, o.MapTimeout)
	}
	ctx, endStep := c.startStep(ctx, StepMap, runID, pg.i)
	start := time.Now()
	result, err = r.mapPage(ctx, pg.page)
	took = time.Since(start)
	cancel()
	if err == nil {
		err = c.checkResultSize(ctx, len(result))
	}
	return result, took, func(err error) { endStep(ctx, err) }, err
}

// settleFailures decides what the pages that failed in this attempt do.
// It returns those to record as failed for good (finals), those that run
// again with the task (retry), and the error the task gives asynq: nil if
// none failed, final if every failure is. A page whose error is not
// transient is final on its last attempt, or if no retry can fix it
// (lastAttempt). If the others all failed for a transient reason (or the
// worker stops before they got their permit) and the task has transient
// retries left, the task takes a transient retry, which spends none of
// the job's retries (transientRetry); else they are final on their last
// attempt too.
//
// A page whose code handed it back (handedBack) is never final and spends
// no retry: it runs again with the task, whatever becomes of the others,
// and the task's error wraps only theirs, so that a real failure beside it
// is still counted. Alone, the task is handed back (errElsewhere).
func (c *Client) settleFailures(ctx, rctx context.Context, k runKeys, first int, failures []pageFailure, o JobOptions) (finals, retry []pageFailure, err error) {
	var back, counted []pageFailure
	for _, f := range failures {
		if handedBack(f.err) {
			back = append(back, f)
		} else {
			counted = append(counted, f)
		}
	}
	finals, retry, err = c.settleCounted(ctx, rctx, k, first, counted, o)
	if len(back) == 0 {
		return finals, retry, err
	}
	retry = append(retry, back...)
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		// Nothing else runs again (the others succeeded, or failed for
		// good and are recorded so): the task is handed back for these.
		err = elsewhere(back[0].err)
	}
	return finals, retry, err
}

// settleCounted is settleFailures for the pages that did not hand
// themselves back.
func (c *Client) settleCounted(ctx, rctx context.Context, k runKeys, first int, failures []pageFailure, o JobOptions) (finals, retry []pageFailure, err error) {
	transient := func(f pageFailure) bool {
		return IsTransient(f.err) || errors.Is(f.err, semaphore.ErrDraining) || drain.Refused(ctx)
	}
	var rest []pageFailure
	for _, f := range failures {
		if !transient(f) && lastAttempt(ctx, f.err, o.MapRetries) {
			f.err = final(f.err)
			finals = append(finals, f)
		} else {
			rest = append(rest, f)
		}
	}
	if len(rest) > 0 && !slices.ContainsFunc(rest, func(f pageFailure) bool { return !transient(f) }) {
		// The task is handed back or retried for all of them: its error
		// must not carry asynq.SkipRetry from one (a page that failed for
		// good while another was refused its permit as the worker stops),
		// or asynq would archive the task.
		cause := rest[0].err
		if i := slices.IndexFunc(rest, func(f pageFailure) bool { return !errors.Is(f.err, asynq.SkipRetry) }); i >= 0 {
			cause = rest[i].err
		} else {
			cause = errors.New(cause.Error())
		}
		if tr := c.transientRetry(rctx, k, strconv.Itoa(first), cause, o); tr != nil {
			return finals, rest, tr
		}
	}
	var errs []error
	for _, f := range rest {
		if lastAttempt(ctx, f.err, o.MapRetries) {
			f.err = final(f.err)
			finals = append(finals, f)
		} else {
			retry = append(retry, f)
			errs = append(errs, f.err)
		}
	}
	if len(errs) > 0 {
		return finals, retry, joinErrors(errs)
	}
	for _, f := range finals {
		errs = append(errs, f.err)
	}
	if len(errs) == 0 {
		return nil, nil, nil
	}
	return finals, nil, final(joinErrors(errs))
}

// joinErrors is errors.Join, but one error stays itself.
func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// pagesName names the pages of a task in an error or a run's last error:
// "page 3", or "pages 0–63".
func pagesName(first, last int) string {
	if first == last {
		return "page " + strconv.Itoa(first)
	}
	return "pages " + pageRange(first, last)
}

// pageRange is the value of a task's attrPages: "0–63".
func pageRange(first, last int) string { return strconv.Itoa(first) + "–" + strconv.Itoa(last) }

// A page's encoded result lives in Redis until its run's retention ends.
// Above maxResultBytes the page fails (for good: it would be as large
// again); above warnResultBytes the worker warns, once a minute at most.
const (
	maxResultBytes  = 32 << 20
	warnResultBytes = 1 << 20
)

// checkResultSize returns the error of a page whose encoded result is n
// bytes, or nil, warning of a large one.
func (c *Client) checkResultSize(ctx context.Context, n int) error {
	if n > maxResultBytes {
		return &malformedError{fmt.Errorf("the result of Map is %.1f MiB encoded, over the %d MiB a page's result may take in Redis, where it stays until the run's retention ends: "+
			"write large output to a store of your own (a table, object storage) and return a reference to it", float64(n)/(1<<20), maxResultBytes>>20)}
	}
	if n > warnResultBytes && onceAMinute(&c.bigResultWarned) {
		Logger(ctx).Warn("mapreduce: a page's result is large: Redis keeps every page's result until the run's retention ends; "+
			"write large output to a store of your own and return a reference to it", "result_bytes", n)
	}
	return nil
}
