package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// handleMap runs Map for one page and records its outcome. A page already
// recorded, or of a run that no longer takes results, is not processed
// again. Errors are returned to asynq, which retries them; on the last
// attempt the page is recorded as failed first, so that the run can go on.
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
	// Watched from before the state check: a Cancel that lands after the
	// check reaches this Map within one CancelPoll.
	wctx, stop := c.watchRun(context.WithValue(context.WithValue(ctx, runIDKey, p.Run), pageIndexKey, p.Index), p.Run)
	defer stop()
	state, nonce, recorded, err := c.pageState(ctx, k, p.Index, r.name())
	if err != nil {
		return fmt.Errorf("mapreduce: page %d of %s: %w", p.Index, p.Run, err)
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
	case recorded:
		return nil // a duplicate delivery
	}

	wctx, endStep := c.startStep(wctx, StepMap, p.Run, p.Index)
	defer func() { endStep(wctx, err) }()
	result, mapErr := r.mapPage(wctx, p.page())
	stop()
	if mapErr == nil {
		mapErr = c.checkResultSize(ctx, len(result))
	}
	if cause := context.Cause(wctx); mapErr != nil && (errors.Is(cause, ErrRunCancelled) || errors.Is(cause, ErrRunEnded)) {
		return nil // the run ended while the page was processed
	}
	rctx, cancel := afterWork(ctx)
	defer cancel()
	var outcome []byte
	failed := mapErr != nil
	if failed {
		mapErr = fmt.Errorf("mapreduce: page %d of %s: %w", p.Index, p.Run, mapErr)
		if tr := c.transientRetry(rctx, k, strconv.Itoa(p.Index), mapErr, o); tr != nil {
			return tr
		}
		if !lastAttempt(ctx, mapErr, o.MapRetries) {
			return mapErr
		}
		mapErr = final(mapErr)
		outcome, _ = json.Marshal(failure{Page: p.page(), Error: mapErr.Error()})
	} else {
		outcome = result
	}
	var st State
	err = c.withRedis(rctx, "recording a page", func(ctx context.Context) (err error) {
		st, err = c.record(ctx, k, p.Nonce, p.Index, outcome, failed, c.claimOf(ctx, r.name()))
		return err
	})
	if err != nil {
		return fmt.Errorf("mapreduce: page %d of %s: recording its outcome: %w", p.Index, p.Run, errors.Join(err, mapErr))
	}
	if st == StateReducing {
		if err := c.enqueueStep(rctx, p.Run, nonce, typeReduce, o); err != nil {
			return fmt.Errorf("mapreduce: page %d of %s: %w", p.Index, p.Run, err)
		}
	}
	return mapErr // nil, or the final failure: asynq archives the task
}

// record runs record.lua for page i of a run: outcome is the encoded result,
// or the encoded failure if failed. claim, if not empty, is the recording
// handler's mark (claimOf), which record deletes. It returns the run's state after the
// call; StateReducing means the caller must make sure the reduce is
// enqueued.
func (c *Client) record(ctx context.Context, k runKeys, nonce string, i int, outcome []byte, failed bool, claim string) (State, error) {
	flag := "0"
	if failed {
		flag = "1"
	}
	keys := []string{k.run, k.recorded, k.results, k.failures}
	if claim != "" {
		keys = append(keys, claim)
	}
	res, err := c.batch(k.job).runScript(ctx, scriptRecord, keys, i, outcome, flag, nonce).Slice()
	if err != nil {
		return "", err
	}
	st, _ := res[1].(string)
	return State(st), nil
}

// pageState reads, in one round trip, the state and nonce of a run and
// whether its page i is recorded, waiting out a Redis outage while ctx
// lives. If job is not empty, the handler that reads, a handler of job,
// claims its task in the same round trip. A run that does not exist has
// state "" and nonce "".
func (c *Client) pageState(ctx context.Context, k runKeys, i int, job string) (state State, nonce string, recorded bool, err error) {
	var (
		fields *redis.SliceCmd
		bit    *redis.IntCmd
		mark   *redis.StatusCmd
	)
	err = c.withRedis(ctx, "reading the run's state", func(ctx context.Context) error {
		if err := c.batch(k.job).do(ctx, func(pl redis.Pipeliner) {
			fields = pl.HMGet(ctx, k.run, "state", "nonce")
			bit = pl.GetBit(ctx, k.recorded, int64(i))
			if job != "" {
				mark = c.claim(ctx, pl, job)
			}
		}); err != nil {
			return err
		}
		if mark != nil && mark.Err() != nil {
			return mark.Err()
		}
		if err := errors.Join(fields.Err(), bit.Err()); err != nil {
			return err
		}
		if len(fields.Val()) != 2 {
			return fmt.Errorf("HMGET of the run's state and nonce returned %d values", len(fields.Val()))
		}
		return nil
	})
	if err != nil {
		return "", "", false, err
	}
	st, _ := fields.Val()[0].(string)
	nonce, _ = fields.Val()[1].(string)
	return State(st), nonce, bit.Val() == 1, nil
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
