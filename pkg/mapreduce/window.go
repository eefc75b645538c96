package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A run's window: the split enqueues a page only while the run has fewer
// than JobOptions.Window pages enqueued or in flight, so that a run of any
// size keeps a bounded number of asynq tasks, and so Redis memory, and
// shares its queue with the job's other runs. The run hash counts the
// pages the split has passed ("fed") and the recorded ones among them
// ("fed_done"): feed.lua moves the first, record.lua counts the second.
//
// Besides the window, a split tops its queue up only while asynq's list of
// pending tasks is short (the backlog): a run started behind a large one
// then waits behind at most that many of its pages, not behind a window's
// worth. The first fill of a run is exempt, so that a small run enqueues
// all of its pages at once.

// defaultWindow is JobOptions.Window's default: about 6 MiB of asynq tasks.
const defaultWindow = 10_000

// windowSizes returns, for a window, how many pages the split waits for
// room to enqueue at once (batch), and the least number of pending tasks
// of its queue it tops up to (backlog). A split whose pages are recorded
// faster tops up to what its workers take in backlogFor (feeder.backlog).
func windowSizes(window int) (batch, backlog int) {
	batch = min(max(window/4, 1), 64)
	backlog = max(2*batch, min(window, 256))
	return batch, backlog
}

// backlogFor is how much work a split keeps pending in its queue: enough
// to keep its workers busy between two of its reads, and little enough
// that a run started behind it starts soon.
const backlogFor = 50 * time.Millisecond

// errHandedOff ends a Split whose feeder has handed the rest of the run to
// a new split task (feeder.handOff).
var errHandedOff = errors.New("mapreduce: the split was handed over to a new split task")

// feeder enqueues a split's pages within the run's window.
type feeder struct {
	c       *Client
	k       runKeys
	run     string
	nonce   string
	o       JobOptions
	pending string // asynq's list of the queue's pending tasks
	started time.Time

	bits   []byte // the recorded pages when the attempt began
	waited bool   // this task has waited for room
	resume int    // pages below it are enqueued or recorded
	fed    int    // pages below it have room in the window

	inFlight sync.WaitGroup // enqueues not yet done

	rateDone int       // pages recorded when the rate was last measured
	rateAt   time.Time // when
	rate     float64   // pages recorded per second, smoothed
}

// backlog returns how many pending tasks the split tops its queue up to:
// what its run's pages are recorded at in backlogFor, at least least and
// at most the window. done is the run's fed_done.
func (f *feeder) backlog(done, least int) int {
	now := time.Now()
	if f.rateAt.IsZero() || done < f.rateDone {
		f.rateDone, f.rateAt = done, now
	} else if dt := now.Sub(f.rateAt); dt >= 100*time.Millisecond {
		r := float64(done-f.rateDone) / dt.Seconds()
		f.rate = 0.5*f.rate + 0.5*r
		f.rateDone, f.rateAt = done, now
	}
	return min(max(least, int(f.rate*backlogFor.Seconds())), f.o.Window)
}

// pendingKey is asynq's list of a queue's pending tasks (asynq's
// base.PendingKey, the same in every release batchmr supports; a test
// checks it against asynq's Inspector).
func pendingKey(queue string) string { return "asynq:{" + queue + "}:pending" }

// stallHandOff is how long a feeder waits for room while none of its
// run's pages is recorded and its queue has pending tasks before it hands
// the run to a new split task, freeing the worker slot it holds: on a
// worker whose every slot holds a split, no page could run.
const stallHandOff = 30 * time.Second

// pastHalf reports whether the split task has waited for room and run for
// half its timeout: it then hands on at its next batch (room), before
// asynq's deadline ends it and spends one of the job's retries. A split
// that never waited is Split's own work, which SplitTimeout bounds as it
// did before windows: handing it on would only make the next task call
// Split again from the start.
func (f *feeder) pastHalf() bool { return f.waited && time.Since(f.started) > f.o.SplitTimeout/2 }

// room waits until the window has room for page i and moves the fed mark
// past it: all pages below i are then enqueued. It returns errHandedOff if
// it handed the run on instead.
func (f *feeder) room(ctx context.Context, i int) error {
	f.inFlight.Wait()
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	f.resume = i
	if f.pastHalf() {
		return f.handOff(ctx, i)
	}
	batch, least := windowSizes(f.o.Window)
	sleep, lastDone, stalledSince := time.Millisecond, -1, time.Now()
	for {
		fed, done, pending, err := f.read(ctx, f.resume, 0)
		if err != nil {
			return err
		}
		free := f.o.Window - (fed - done)
		if fed > 0 { // the first fill of a run is exempt: a small run enqueues at once
			free = min(free, f.backlog(done, least)-pending)
		}
		if fed > i {
			// Another attempt of this split fed past i: its pages are counted.
			f.fed = fed
			return nil
		}
		if free >= batch || (free > 0 && fed == 0) {
			to := f.walk(i, free)
			if _, _, _, err := f.read(ctx, f.resume, to); err != nil {
				return err
			}
			f.fed = to
			return nil
		}
		if done != lastDone {
			lastDone, stalledSince = done, time.Now()
		}
		f.waited = true
		if f.pastHalf() || (pending > 0 && time.Since(stalledSince) > f.c.stallHandOff) {
			return f.handOff(ctx, i)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(sleep):
		}
		sleep = min(2*sleep, 20*time.Millisecond)
	}
}

// walk returns the end of the range from page i that holds free pages not
// yet recorded.
func (f *feeder) walk(i, free int) int {
	for ; free > 0 || bitSet(f.bits, i); i++ {
		if !bitSet(f.bits, i) {
			free--
		}
	}
	return i
}

// read runs feed.lua (moving resume and, if to > 0, the fed mark) and reads
// the length of the queue's pending list, in one round trip, which the
// run's handlers' calls may share (batch.go).
func (f *feeder) read(ctx context.Context, resume, to int) (fed, done, pending int, err error) {
	args := []any{f.nonce, resume, to}
	var (
		res *redis.Cmd
		n   *redis.IntCmd
	)
	err = f.c.withRedis(ctx, "moving the run's window", func(ctx context.Context) error {
		if err := f.c.batch(f.k.job).doScript(ctx, scriptFeed, func(p redis.Pipeliner) *redis.Cmd {
			res = scriptFeed.EvalSha(ctx, p, []string{f.k.run, f.k.recorded}, args...)
			n = p.LLen(ctx, f.pending)
			return res
		}); err != nil {
			return err
		}
		return errors.Join(res.Err(), n.Err())
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("mapreduce: split of %s: %w", f.run, err)
	}
	v, _ := res.Slice()
	fed64, _ := v[0].(int64)
	if fed64 < 0 {
		return 0, 0, 0, errRunGone
	}
	done64, _ := v[1].(int64)
	return int(fed64), int(done64), int(n.Val()), nil
}

// errRunGone stops a feeder whose run is no longer splitting under its
// nonce: it ended, was resumed by Retry, or another attempt finished the
// split.
var errRunGone = errors.New("mapreduce: the run is no longer splitting")

// handOff records that every page below i is enqueued and enqueues a new
// split task that starts there, so that this one can end.
func (f *feeder) handOff(ctx context.Context, i int) error {
	if err := f.c.handOn(ctx, f.k, f.run, f.nonce, i, f.o); err != nil {
		if errors.Is(err, errRunGone) {
			return err
		}
		return fmt.Errorf("mapreduce: split of %s: %w", f.run, err)
	}
	Logger(ctx).Info("mapreduce: split handed over to a new split task", "from_page", i)
	return errHandedOff
}

// handOn enqueues a new split task for a splitting run, under a name no
// split task of the run had (feed.lua), that starts at page resume (or
// where the run's resume mark is, if further). The reconciler calls it for
// a run whose split task ended without ending the split.
func (c *Client) handOn(ctx context.Context, k runKeys, run, nonce string, resume int, o JobOptions) error {
	var v []any
	err := c.withRedis(ctx, "handing the split on", func(ctx context.Context) (err error) {
		v, err = scriptFeed.Run(ctx, c.rdb, []string{k.run, k.recorded}, nonce, resume, 0, "1").Slice()
		return err
	})
	if err != nil {
		return err
	}
	if n, _ := v[0].(int64); n < 0 {
		return errRunGone
	}
	step, _ := v[2].(string)
	return c.enqueueStepAs(ctx, run, nonce, typeSplit, step, o)
}
