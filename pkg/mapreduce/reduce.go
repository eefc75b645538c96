package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// handleReduce runs Reduce over every recorded page and ends the run. Only
// a run in the reducing state is reduced, and only the first outcome is
// recorded: a duplicate reduce task, or one that overlapped a slow first
// one, cannot change the result.
func (c *Client) handleReduce(ctx context.Context, t *asynq.Task) (err error) {
	pl, err := decodeRunPayload(t)
	if err != nil {
		return err
	}
	run := pl.Run
	r, err := c.runner(ctx, t, run)
	if err != nil {
		return err
	}
	k, _ := c.keys(run)
	var fields *redis.SliceCmd
	err = c.withRedis(ctx, "reading the run", func(ctx context.Context) error {
		_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			fields = p.HMGet(ctx, k.run, "state", "args", "total", "failed", "nonce", "packed")
			c.claim(ctx, p, r.name())
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("mapreduce: reduce of %s: %w", run, err)
	}
	vals := fields.Val()
	if s, _ := vals[0].(string); State(s) != StateReducing || vals[4] != pl.Nonce {
		return nil // ended already, expired, or a task of an earlier run under this ID
	}
	args, _ := vals[1].(string)
	total, failedPages := atoi(str(vals[2])), atoi(str(vals[3]))
	per := bundlePages // a run started before bundles has none to read
	if s, ok := vals[5].(string); ok {
		if per, err = strconv.Atoi(s); err != nil || per < 1 || per > 256 {
			msg := fmt.Sprintf("the run's record says its small results are bundled %q pages to a field; a release of batchmr bundles 1 to 256: the record was changed by something other than batchmr", s)
			return c.end(ctx, run, pl.Nonce, StateFailed, nil, msg)
		}
	}
	ctx, endStep := c.startStep(ctx, StepReduce, run, -1)
	stepCtx := ctx // the reduce's watched context, once it has one
	defer func() { endStep(stepCtx, err) }()
	pages := c.storedPages(ctx, k, total, per)
	rctx, cancel := afterWork(ctx)
	defer cancel()

	if failedPages > 0 && r.options().Semantics == SuccessSemantics {
		msg, err := c.describeFailures(ctx, k, total, failedPages)
		if err != nil {
			return fmt.Errorf("mapreduce: reduce of %s: %w", run, err)
		}
		return c.end(rctx, run, pl.Nonce, StateFailed, nil, msg)
	}
	var result []byte
	if r.hasReduce() {
		wctx, stop := c.watchRun(context.WithValue(ctx, runIDKey, run), run)
		stepCtx = wctx
		result, err = r.reduce(wctx, []byte(args), pages)
		stop()
		if err == nil {
			err = c.checkRunResultSize(ctx, len(result))
		}
		if cause := context.Cause(wctx); err != nil && (errors.Is(cause, ErrRunCancelled) || errors.Is(cause, ErrRunEnded)) {
			return nil
		}
		if err != nil {
			err = fmt.Errorf("mapreduce: reduce of %s: %w", run, err)
			if tr := c.transientRetry(rctx, k, "reduce", err, c.options(r)); tr != nil {
				return tr
			}
			if !lastAttempt(ctx, err, c.options(r).StepRetries) {
				return err
			}
			if ferr := c.end(rctx, run, pl.Nonce, StateFailed, nil, err.Error()); ferr != nil {
				return errors.Join(err, ferr)
			}
			return final(err)
		}
	}
	return c.end(rctx, run, pl.Nonce, StateSucceeded, result, "")
}

// end finishes a reducing run, unless Retry has resumed it since (nonce).
func (c *Client) end(ctx context.Context, run, nonce string, to State, result []byte, msg string) error {
	if _, _, err := c.finish(ctx, run, nonce, to, result, msg, StateReducing); err != nil {
		return fmt.Errorf("mapreduce: reduce of %s: recording the outcome: %w", run, err)
	}
	return nil
}

// storedPageChunk is about how many pages one round trip reads: rounded
// to a whole number of bundles.
const storedPageChunk = 512

// bundlePages is how many pages' small results share one field of a run's
// results hash (record.lua): a result of at most 64 bytes costs its length
// plus two bytes there, where a field of its own costs ~60 bytes more (a
// 10M-page run's results hash was 644 MiB). start.lua keeps it in the run
// ('packed'), and a reduce reads the run's, so that a run keeps the layout
// it started with; a run started by a release before bundles has none, and
// its results have a field each. At most 256: an entry's index in its
// bundle is one byte.
const bundlePages = 128

// storedPages yields every page of a run in index order, reading them from
// Redis a chunk at a time, so that Reduce over a million pages never holds
// them all.
// Small results are read from bundles of per pages.
func (c *Client) storedPages(ctx context.Context, k runKeys, total, per int) iter.Seq2[storedPage, error] {
	chunk := max(1, storedPageChunk/per) * per
	return func(yield func(storedPage, error) bool) {
		for lo := 0; lo < total; lo += chunk {
			hi := min(lo+chunk, total)
			fields := make([]string, 0, hi-lo+chunk/per)
			for i := lo; i < hi; i++ {
				fields = append(fields, strconv.Itoa(i))
			}
			for b := lo / per; b*per < hi; b++ {
				fields = append(fields, "b"+strconv.Itoa(b))
			}
			var res, fail *redis.SliceCmd
			_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				res = p.HMGet(ctx, k.results, fields...)
				fail = p.HMGet(ctx, k.failures, fields[:hi-lo]...)
				return nil
			})
			if err != nil {
				yield(storedPage{index: lo}, fmt.Errorf("reading pages %d-%d: %w", lo, hi-1, err))
				return
			}
			bundled, err := unbundle(lo, hi, per, res.Val()[hi-lo:])
			if err != nil {
				yield(storedPage{index: lo}, err)
				return
			}
			for j, i := 0, lo; i < hi; i, j = i+1, j+1 {
				sp := storedPage{index: i}
				var err error
				if s, ok := res.Val()[j].(string); ok {
					sp.result = []byte(s)
				} else if r := bundled[j]; r != nil {
					sp.result = r
				} else if s, ok := fail.Val()[j].(string); ok {
					sp.failure = &failure{}
					if uerr := json.Unmarshal([]byte(s), sp.failure); uerr != nil {
						err = fmt.Errorf("page %d: malformed failure record: %w", i, uerr)
					}
				} else {
					err = fmt.Errorf("page %d has no recorded outcome (its keys expired, or were deleted)", i)
				}
				if !yield(sp, err) || err != nil {
					return
				}
			}
		}
	}
}

// unbundle returns the results of pages lo to hi-1 (lo a multiple of per)
// held in the bundles of per pages read for them, in page order; a page
// with none in them is nil. Bundles are strings of entries <index within
// the bundle><length><bytes> (record.lua); a missing one is nil.
func unbundle(lo, hi, per int, bundles []any) ([][]byte, error) {
	out := make([][]byte, hi-lo)
	for n, v := range bundles {
		s, ok := v.(string)
		if !ok {
			continue
		}
		first := (lo/per + n) * per
		for at := 0; at < len(s); {
			if at+2 > len(s) || at+2+int(s[at+1]) > len(s) || int(s[at]) >= per {
				return nil, fmt.Errorf("the results of pages %d-%d are malformed at byte %d of %d: field b%d of the run's results hash was written by something other than batchmr",
					first, first+per-1, at, len(s), lo/per+n)
			}
			i, size := first+int(s[at]), int(s[at+1])
			if i >= lo && i < hi {
				out[i-lo] = []byte(s[at+2 : at+2+size])
			}
			at += 2 + size
		}
	}
	return out, nil
}

// describeFailures names the failed pages of a run, for the error of a run
// that fails under SuccessSemantics: the first ten, from the failures hash
// alone.
func (c *Client) describeFailures(ctx context.Context, k runKeys, total, failed int) (string, error) {
	const show = 10
	fields, err := c.rdb.HKeys(ctx, k.failures).Result()
	if err != nil {
		return "", err
	}
	idx := make([]int, 0, len(fields))
	for _, f := range fields {
		if i, err := strconv.Atoi(f); err == nil {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	idx = idx[:min(show, len(idx))]
	first := make([]string, len(idx))
	for j, i := range idx {
		first[j] = strconv.Itoa(i)
	}
	var vals []any
	if len(first) > 0 {
		if vals, err = c.rdb.HMGet(ctx, k.failures, first...).Result(); err != nil {
			return "", err
		}
	}
	parts := make([]string, 0, len(idx))
	for j, i := range idx {
		var f failure
		if s, ok := vals[j].(string); ok {
			_ = json.Unmarshal([]byte(s), &f)
		}
		parts = append(parts, fmt.Sprintf("page %d: %s", i, f.Error))
	}
	more := ""
	if failed > len(parts) {
		more = fmt.Sprintf("; and %d more", failed-len(parts))
	}
	return fmt.Sprintf("%d of %d pages failed (SuccessSemantics: Reduce not run): %s%s", failed, total, strings.Join(parts, "; "), more), nil
}
