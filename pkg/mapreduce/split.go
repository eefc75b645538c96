package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// handleSplit runs the job's Split and enqueues one map task per page,
// EnqueueConcurrency at a time, while the run's window has room
// (window.go). A split that starts again — a retry, a copy of an orphaned
// split, or a split handed on by one that ran long — skips the pages an
// earlier attempt enqueued (below the run's resume mark) without enqueuing
// them, and pages already recorded; the pages between the mark and the
// end of the window are enqueued again, which their task IDs make no-ops
// while their tasks exist. Only when every page is enqueued does it write
// the total, which is what lets the last recorded page trigger the reduce.
func (c *Client) handleSplit(ctx context.Context, t *asynq.Task) (err error) {
	pl, err := decodeRunPayload(t)
	if err != nil {
		return err
	}
	run := pl.Run
	r, err := c.runner(ctx, t, run)
	if err != nil {
		return err
	}
	o := c.options(r)
	k, _ := c.keys(run)
	var (
		fields   *redis.SliceCmd
		recorded *redis.StringCmd
	)
	if err := c.withRedis(ctx, "reading the run", func(ctx context.Context) error {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			fields = p.HMGet(ctx, k.run, "state", "args", "nonce", "resume")
			recorded = p.Get(ctx, k.recorded)
			c.claim(ctx, p, r.name())
			return nil
		})
		if errors.Is(err, redis.Nil) {
			return nil
		}
		return err
	}); err != nil {
		return fmt.Errorf("mapreduce: split of %s: %w", run, err)
	}
	vals := fields.Val()
	state, _ := vals[0].(string)
	args, _ := vals[1].(string)
	nonce, _ := vals[2].(string)
	resume, _ := vals[3].(string)
	if State(state) != StateSplitting || nonce != pl.Nonce {
		return nil // already split, ended, expired, or a task of an earlier run under this ID
	}
	f := &feeder{c: c, k: k, run: run, nonce: nonce, o: o, pending: pendingKey(o.Queue), started: time.Now(),
		bits: []byte(recorded.Val())}
	f.resume, _ = strconv.Atoi(resume)
	f.fed = f.resume

	ctx, endStep := c.startStep(ctx, StepSplit, run, -1)
	defer func() { endStep(ctx, err) }()
	ctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, run), run)
	defer stop()
	ctx = context.WithValue(ctx, expectKey, func(ctx context.Context, n int) error {
		if n < 0 {
			return fmt.Errorf("mapreduce: ExpectPages(%d): want a number of pages, 0 or more", n)
		}
		return c.withRedis(ctx, "recording the pages expected", func(ctx context.Context) error {
			return scriptFeed.Run(ctx, c.rdb, []string{k.run, k.recorded}, nonce, 0, 0, "", n).Err()
		})
	})
	type item struct {
		i    int
		page []byte
	}
	work := make(chan item, c.cfg.EnqueueConcurrency)
	gctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	var wg sync.WaitGroup
	for range c.cfg.EnqueueConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				if err := c.enqueueMap(gctx, run, nonce, it.i, it.page, o); err != nil {
					abort(err)
				}
				f.inFlight.Done()
			}
		}()
	}
	// emit must be called from one goroutine, in a deterministic order (page
	// numbers must be the same on retry); the mutex only keeps a misuse from
	// corrupting the count. It fails after Split returned, and once an
	// enqueue failed.
	var emitMu sync.Mutex
	n, closed := 0, false
	splitErr := r.split(gctx, []byte(args), func(page []byte) error {
		emitMu.Lock()
		defer emitMu.Unlock()
		switch {
		case gctx.Err() != nil:
			return context.Cause(gctx)
		case closed:
			return errors.New("mapreduce: emit called after Split returned")
		case n >= maxPages:
			return fmt.Errorf("mapreduce: a run has at most %d pages", maxPages)
		}
		i := n
		n++
		if i < f.resume || bitSet(f.bits, i) {
			return nil // enqueued by an earlier attempt, or recorded
		}
		if i >= f.fed {
			if err := f.room(gctx, i); err != nil {
				abort(err)
				return err
			}
		}
		f.inFlight.Add(1)
		select {
		case work <- item{i, page}:
			return nil
		case <-gctx.Done():
			f.inFlight.Done()
			return context.Cause(gctx)
		}
	})
	emitMu.Lock()
	closed = true
	close(work)
	emitMu.Unlock()
	wg.Wait()
	if cause := context.Cause(ctx); errors.Is(cause, ErrRunCancelled) || errors.Is(cause, ErrRunEnded) {
		return nil // the run ended while splitting: nothing more to do
	}
	if cause := context.Cause(gctx); errors.Is(cause, errHandedOff) || errors.Is(cause, errRunGone) {
		return nil // a new split task goes on; or the run has moved on without this one
	}
	if splitErr == nil {
		splitErr = context.Cause(gctx) // an enqueue failed, or nil
	}
	rctx, cancel := afterWork(ctx)
	defer cancel()
	if splitErr != nil {
		err := fmt.Errorf("mapreduce: split of %s after %d pages: %w", run, n, splitErr)
		var m *malformedError
		if errors.As(splitErr, &m) { // arguments no retry can fix
			err = fmt.Errorf("mapreduce: split of %s: %w", run, splitErr)
		}
		if tr := c.transientRetry(rctx, k, "split", err, o); tr != nil {
			return tr
		}
		if lastAttempt(ctx, splitErr, o.StepRetries) {
			c.failRun(rctx, run, nonce, err)
			return final(err)
		}
		return err
	}
	var st string
	err = c.withRedis(rctx, "recording the split's total", func(ctx context.Context) (err error) {
		st, err = scriptSplitDone.Run(ctx, c.rdb, []string{k.run, k.recorded}, n, nonce).Text()
		return err
	})
	if err != nil {
		return fmt.Errorf("mapreduce: split of %s: recording the total of %d pages: %w", run, n, err)
	}
	if st == "nondeterministic" {
		err := fmt.Errorf("mapreduce: split of %s: Split emitted %d pages, but an earlier attempt emitted more and they were recorded: "+
			"Split must emit the same pages in the same order every time it runs: %w", run, n, asynq.SkipRetry)
		c.failRun(rctx, run, nonce, err)
		return err
	}
	if State(st) == StateReducing {
		return c.enqueueStep(rctx, run, nonce, typeReduce, o)
	}
	return nil
}

// bitSet reads bit i of a Redis bitmap (most significant bit first).
func bitSet(bits []byte, i int) bool {
	return i/8 < len(bits) && bits[i/8]&(0x80>>(i%8)) != 0
}

// failRun ends a run as failed with err's message, unless it has ended or
// Retry has resumed it since (nonce).
func (c *Client) failRun(ctx context.Context, run, nonce string, err error) {
	if _, _, ferr := c.finish(ctx, run, nonce, StateFailed, nil, err.Error(), ""); ferr != nil {
		Logger(ctx).Error("mapreduce: could not mark the run failed; the reconciler will retry", "reason", err, "error", ferr)
	}
}
