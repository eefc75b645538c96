package mapreduce

import (
	"context"
	"sync"
	"time"
)

// watch is one handler at work on a run; it is cancelled with cause
// ErrRunCancelled when the run is cancelled while the handler works, and
// ErrRunEnded when it fails or expires.
type watch struct {
	cancel context.CancelCauseFunc
}

// watchRun returns a context that is cancelled once the run ends (it was
// cancelled, or failed) and a function to stop watching. One goroutine per
// Client polls the states of all the runs its handlers work on, in one
// pipelined round trip every CancelPoll; it exits when nothing is watched.
// The stop function may be called more than once.
func (c *Client) watchRun(ctx context.Context, runID string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &watch{cancel: cancel}
	c.watchMu.Lock()
	set := c.watches[runID]
	if set == nil {
		set = map[*watch]struct{}{}
		c.watches[runID] = set
	}
	set[w] = struct{}{}
	if !c.watching {
		c.watching = true
		go c.pollRuns()
	}
	c.watchMu.Unlock()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			c.watchMu.Lock()
			// A run's set leaves the map only once empty, so w is still in it.
			delete(set, w)
			if len(set) == 0 {
				delete(c.watches, runID)
			}
			c.watchMu.Unlock()
			cancel(context.Canceled)
		})
	}
}

func (c *Client) pollRuns() {
	t := time.NewTicker(c.cfg.CancelPoll)
	defer t.Stop()
	var lastWarn time.Time
	for range t.C {
		c.watchMu.Lock()
		if len(c.watches) == 0 {
			c.watching = false
			c.watchMu.Unlock()
			return
		}
		runs := make([]string, 0, len(c.watches))
		for run := range c.watches {
			runs = append(runs, run)
		}
		c.watchMu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), max(4*c.cfg.CancelPoll, time.Second))
		states, gone, err := c.ledger.states(ctx, runs)
		cancel()
		if err != nil {
			// Unreachable Redis: handlers go on; the next poll tries again.
			if !c.backgroundFailed(err, "checking runs for cancellation") && time.Since(lastWarn) > 10*time.Second {
				lastWarn = time.Now()
				c.log.Warn("mapreduce: checking runs for cancellation failed; retrying", "error", err)
			}
			continue
		}
		c.backgroundAnswered(false)
		for i, run := range runs {
			cause := ErrRunEnded
			switch st := states[i]; {
			case st == StateCancelled:
				cause = ErrRunCancelled
			case st == StateFailed, gone[i]:
			default:
				continue
			}
			c.watchMu.Lock()
			for w := range c.watches[run] {
				w.cancel(cause)
			}
			c.watchMu.Unlock()
		}
	}
}
