package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

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
			fields = p.HMGet(ctx, k.run, "state", "args", "nonce", "resume", "fed", "cursor", "feeding", "pack", "pack_from")
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
	if State(state) != StateSplitting || nonce != pl.Nonce {
		return nil // already split, ended, expired, or a task of an earlier run under this ID
	}
	f := &feeder{c: c, k: k, run: run, nonce: nonce, o: o, pending: pendingKey(o.Queue), active: activeKey(o.Queue), started: time.Now(), probeFrom: -1,
		bits: []byte(recorded.Val())}
	f.ready = sync.NewCond(&f.mu)
	var pk packing
	if pack := atoi(str(vals[7])); pack > 1 {
		pk = packing{k: pack, from: atoi(str(vals[8]))}
	}
	f.setPack(pk)
	batch, _ := windowSizes(o.Window)
	f.packLimit = min(o.PagesPerTask, floorPow2(batch))
	f.token = newNonce()
	if id, ok := asynq.GetTaskID(ctx); ok {
		if step, ok := strings.CutPrefix(id, taskID(run, nonce, "")); ok {
			f.step = step
		}
	}
	resume, fed := atoi(str(vals[3])), atoi(str(vals[4]))
	cursor, hasCursor := vals[5].(string)

	ctx, endStep := c.startStep(ctx, StepSplit, run, -1)
	defer func() { endStep(ctx, err) }()
	ctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, run), run)
	defer stop()

	// Pages below resume are enqueued or recorded. Those in [resume, fed)
	// were fed, and the last feed stored them, with the cursor of page
	// fed-1: enqueue them again, since a crash may have come before their
	// enqueues, and go on after them. Without a stored feed that ends at
	// fed-1 (it is unreadable, or something other than batchmr changed
	// the record), Split runs from the start, and its pages in [resume,
	// fed) are enqueued again as it emits them.
	f.fed, f.counted, f.redoFrom = resume, fed, resume
	last := false // the stored feed is the last one
	if feeding, ok := vals[6].(string); ok && fed > 0 {
		pages, derr := decodeFeeding([]byte(feeding))
		switch {
		case derr != nil:
			Logger(ctx).Warn("mapreduce: the pages the split fed last are unreadable; Split runs again from the start to enqueue them", "error", derr)
		case len(pages) > 0 && pages[len(pages)-1].i == fed-1:
			last = true
			for _, p := range pages {
				if p.i >= resume && !bitSet(f.bits, p.i) {
					f.redo = append(f.redo, p)
				}
			}
			f.fed = max(fed, resume)
		}
	}
	skip := f.fed // emit's: the feeder moves f.fed
	sc := &splitState{cursor: cursor, has: hasCursor && last, base: fed}
	sc.expect = func(ctx context.Context, n int) error {
		return c.withRedis(ctx, "recording the pages expected", func(ctx context.Context) error {
			return scriptFeed.Run(ctx, c.rdb, []string{k.run, k.recorded}, nonce, 0, 0, "", n).Err()
		})
	}
	ctx = context.WithValue(ctx, splitKey, sc)

	gctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	defer context.AfterFunc(gctx, f.wake)()
	fedAll := make(chan struct{})
	go func() {
		defer close(fedAll)
		if err := f.loop(gctx); err != nil {
			abort(err)
		}
	}()
	// emit must be called from one goroutine, in a deterministic order (page
	// numbers must be the same on retry); the mutex only keeps a misuse from
	// corrupting the count. It fails after Split returned, and once an
	// enqueue failed.
	var emitMu sync.Mutex
	closed := false
	splitErr := r.split(gctx, []byte(args), func(page []byte) error {
		emitMu.Lock()
		defer emitMu.Unlock()
		switch {
		case gctx.Err() != nil:
			return context.Cause(gctx)
		case closed:
			return errors.New("mapreduce: emit called after Split returned")
		}
		i, cursor := sc.emitting()
		if i >= maxPages {
			return fmt.Errorf("mapreduce: a run has at most %d pages", maxPages)
		}
		if i < skip || bitSet(f.bits, i) {
			return nil // fed by an earlier attempt, or recorded
		}
		return f.add(gctx, fedPage{i: i, page: page, cursor: cursor})
	})
	emitMu.Lock()
	closed = true
	n := sc.pages()
	emitMu.Unlock()
	if splitErr != nil {
		abort(splitErr) // the pages still buffered wait for a retry: it emits them again
	}
	f.close()
	<-fedAll
	if cause := context.Cause(ctx); errors.Is(cause, ErrRunCancelled) || errors.Is(cause, ErrRunEnded) {
		return nil // the run ended while splitting: nothing more to do
	}
	if cause := context.Cause(gctx); errors.Is(cause, errHandedOff) || errors.Is(cause, errRunGone) || errors.Is(cause, errSplitTaken) {
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
		if errors.As(splitErr, &m) { // arguments no retry can fix (Status.ArgsRefused)
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
		st, err = c.batch(k.job).runScriptSynced(ctx, scriptSplitDone, []string{k.run, k.recorded}, n, nonce).Text()
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

// str returns v if it is a string, and "" otherwise (a missing field).
func str(v any) string {
	s, _ := v.(string)
	return s
}
