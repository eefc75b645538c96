package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// handleMap runs Map for the pages of a map task — one, or a pack's group
// (pack.go) — one after another, and records their outcomes in one call.
// A page already recorded, or of a run that no longer takes results, is
// not processed again. A failed page is returned to asynq, which retries
// the task: the pages recorded meanwhile are skipped then. On a page's
// last attempt it is recorded as failed, so that the run can go on.
func (c *Client) handleMap(ctx context.Context, t *asynq.Task) (err error) {
	p, err := decodeMapPayload(t)
	if err != nil {
		return err
	}
	r, err := c.runner(ctx, t, p.Run)
	if err != nil {
		return err
	}
	o := c.options(r)
	k, _ := c.keys(p.Run)
	pages := p.parts()
	first, last := pages[0].i, pages[len(pages)-1].i
	// Watched from before the state check: a Cancel that lands after the
	// check reaches this Map within one CancelPoll.
	wctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, p.Run), p.Run)
	defer stop()
	state, nonce, recorded, err := c.pageState(ctx, k, first, last, r.name())
	if err != nil {
		return fmt.Errorf("mapreduce: %s of %s: %w", pagesName(first, last), p.Run, err)
	}
	switch st := state; {
	case nonce != p.Nonce:
		return nil // a task of an earlier run under this ID, or the run expired
	case st == StateReducing:
		// Recorded, and possibly by a handler that died before enqueuing
		// the reduce: make sure it is enqueued.
		return c.enqueueStep(ctx, p.Run, nonce, typeReduce, o)
	case st != StateSplitting && st != StateMapping:
		return nil // ended, or expired
	}
	todo := pages[:0:0]
	for _, pg := range pages {
		if !recorded.has(pg.i) {
			todo = append(todo, pg)
		}
	}
	if len(todo) == 0 {
		return nil // a duplicate delivery
	}

	packed := t.Type() == typePages
	var (
		outcomes []pageOutcome
		failures []pageFailure
		mapUS    int64
	)
	for _, pg := range todo {
		result, took, mapErr := c.mapOne(wctx, r, p.Run, pg, packed, o)
		if cause := context.Cause(wctx); errors.Is(cause, ErrRunCancelled) || errors.Is(cause, ErrRunEnded) {
			return nil // the run ended while its pages were processed
		}
		if mapErr != nil {
			failures = append(failures, pageFailure{pg, fmt.Errorf("mapreduce: page %d of %s: %w", pg.i, p.Run, mapErr)})
			continue
		}
		mapUS += took.Microseconds()
		outcomes = append(outcomes, pageOutcome{i: pg.i, outcome: result})
	}
	stop()
	measured := len(outcomes)
	rctx, cancel := afterWork(ctx)
	defer cancel()
	finals, mapErr := c.settleFailures(ctx, rctx, k, first, failures, o)
	for _, f := range finals {
		b, _ := json.Marshal(failure{Page: f.page.page, Error: f.err.Error()})
		outcomes = append(outcomes, pageOutcome{i: f.page.i, outcome: b, failed: true})
	}
	var st State
	if len(outcomes) > 0 {
		err = c.withRedis(rctx, "recording pages", func(ctx context.Context) (err error) {
			st, err = c.record(ctx, k, p.Nonce, outcomes, mapUS, measured, c.claimOf(ctx, r.name()))
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("mapreduce: %s of %s: recording the outcome: %w", pagesName(first, last), p.Run, errors.Join(err, mapErr))
	}
	if st == StateReducing {
		if err := c.enqueueStep(rctx, p.Run, nonce, typeReduce, o); err != nil {
			return fmt.Errorf("mapreduce: %s of %s: %w", pagesName(first, last), p.Run, err)
		}
	}
	return mapErr // nil, a failure to retry, or the final failure: asynq archives the task
}

// pageOutcome is what record stores of page i: its encoded result, or its
// encoded failure if failed.
type pageOutcome struct {
	i       int
	outcome []byte
	failed  bool
}

// pageFailure is a page whose Map failed in this attempt, with its error.
type pageFailure struct {
	page fedPage
	err  error
}

// mapOne runs Map for page pg of a run with its own context: the page's
// index, and in a task of several pages (packed) its own logger attribute
// and MapTimeout, which asynq's deadline sets for a task of one. It
// returns Map's result, checked for size, how long Map took, and its
// error.
func (c *Client) mapOne(wctx context.Context, r jobRunner, run string, pg fedPage, packed bool, o JobOptions) (result []byte, took time.Duration, err error) {
	ctx := context.WithValue(wctx, pageIndexKey, pg.i)
	if packed {
		ctx = ContextWithLogger(ctx, withPage(Logger(ctx), pg.i))
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.MapTimeout)
		defer cancel()
	}
	ctx, endStep := c.startStep(ctx, StepMap, run, pg.i)
	start := time.Now()
	result, err = r.mapPage(ctx, pg.page)
	took = time.Since(start)
	if err == nil {
		err = c.checkResultSize(ctx, len(result))
	}
	endStep(ctx, err)
	return result, took, err
}

// settleFailures decides what the pages that failed in this attempt do,
// and returns the error the task gives asynq (nil if none failed) and
// the failures to record as final. If every failure is transient and the
// task has transient retries left, or the worker stops before the pages
// got their permit, the task is retried without spending a retry
// (transientRetry), and none is final. Otherwise a page whose retries are
// spent, or whose error no retry can fix (lastAttempt), is final; the
// others retry with the task, which is archived once none does.
func (c *Client) settleFailures(ctx, rctx context.Context, k runKeys, first int, failures []pageFailure, o JobOptions) (finals []pageFailure, err error) {
	if len(failures) == 0 {
		return nil, nil
	}
	transient := true
	for _, f := range failures {
		if !IsTransient(f.err) && !errors.Is(f.err, semaphore.ErrDraining) {
			transient = false
		}
	}
	if transient || semaphore.Drained(ctx) {
		if tr := c.transientRetry(rctx, k, strconv.Itoa(first), failures[0].err, o); tr != nil {
			return nil, tr
		}
	}
	var retry []error
	for _, f := range failures {
		if lastAttempt(ctx, f.err, o.MapRetries) {
			f.err = final(f.err)
			finals = append(finals, f)
		} else {
			retry = append(retry, f.err)
		}
	}
	if len(retry) > 0 {
		return finals, joinErrors(retry)
	}
	errs := make([]error, len(finals))
	for i, f := range finals {
		errs[i] = f.err
	}
	return finals, final(joinErrors(errs))
}

// joinErrors is errors.Join, but one error stays itself.
func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// pagesName names the pages of a task in an error: "page 3", or "pages
// 0–63".
func pagesName(first, last int) string {
	if first == last {
		return "page " + strconv.Itoa(first)
	}
	return "pages " + strconv.Itoa(first) + "–" + strconv.Itoa(last)
}

// record runs record.lua for pages of a run. mapUS is how long Map took
// over the measured pages that succeeded, for the run's packing (pack.go).
// claim, if not empty, is the recording handler's mark (claimOf), which
// record deletes. It returns the run's state after the call;
// StateReducing means the caller must make sure the reduce is enqueued.
func (c *Client) record(ctx context.Context, k runKeys, nonce string, pages []pageOutcome, mapUS int64, measured int, claim string) (State, error) {
	keys := []string{k.run, k.recorded, k.results, k.failures}
	if claim != "" {
		keys = append(keys, claim)
	}
	args := make([]any, 0, 3+3*len(pages))
	args = append(args, nonce, mapUS, measured)
	for _, p := range pages {
		flag := "0"
		if p.failed {
			flag = "1"
		}
		args = append(args, p.i, p.outcome, flag)
	}
	res, err := c.batch(k.job).runScript(ctx, scriptRecord, keys, args...).Slice()
	if err != nil {
		return "", err
	}
	st, _ := res[1].(string)
	return State(st), nil
}

// recordedBits is part of a run's bitmap of recorded pages: its bytes from
// the one that holds page from.
type recordedBits struct {
	from int
	b    []byte
}

func (r recordedBits) has(i int) bool { return bitSet(r.b, i-r.from/8*8) }

// pageState reads, in one round trip, the state and nonce of a run and
// which of its pages first to last are recorded, waiting out a Redis
// outage while ctx lives. If job is not empty, the handler that reads, a
// handler of job, claims its task in the same round trip. A run that does
// not exist has state "" and nonce "".
func (c *Client) pageState(ctx context.Context, k runKeys, first, last int, job string) (state State, nonce string, recorded recordedBits, err error) {
	var (
		fields *redis.SliceCmd
		bits   *redis.StringCmd
		mark   *redis.StatusCmd
	)
	err = c.withRedis(ctx, "reading the run's state", func(ctx context.Context) error {
		if err := c.batch(k.job).do(ctx, func(pl redis.Pipeliner) {
			fields = pl.HMGet(ctx, k.run, "state", "nonce")
			bits = pl.GetRange(ctx, k.recorded, int64(first/8), int64(last/8))
			if job != "" {
				mark = c.claim(ctx, pl, job)
			}
		}); err != nil {
			return err
		}
		if mark != nil && mark.Err() != nil {
			return mark.Err()
		}
		if err := errors.Join(fields.Err(), bits.Err()); err != nil {
			return err
		}
		if len(fields.Val()) != 2 {
			return fmt.Errorf("HMGET of the run's state and nonce returned %d values", len(fields.Val()))
		}
		return nil
	})
	if err != nil {
		return "", "", recordedBits{}, err
	}
	st, _ := fields.Val()[0].(string)
	nonce, _ = fields.Val()[1].(string)
	return State(st), nonce, recordedBits{from: first, b: []byte(bits.Val())}, nil
}

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
	if last := c.bigResultWarned.Load(); n > warnResultBytes && time.Since(time.Unix(0, last)) >= time.Minute &&
		c.bigResultWarned.CompareAndSwap(last, time.Now().UnixNano()) {
		Logger(ctx).Warn("mapreduce: a page's result is large: Redis keeps every page's result until the run's retention ends; "+
			"write large output to a store of your own and return a reference to it", "result_bytes", n)
	}
	return nil
}
