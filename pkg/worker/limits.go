package worker

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
)

// limitCheckEvery is how often a worker reads its semaphores' limits.
const limitCheckEvery = 10 * time.Second

// limits returns the limit Redis holds for each of the worker's
// semaphores that has one (a read that fails leaves its name out).
func (w *running) limits(ctx context.Context) map[string]int {
	out := map[string]int{}
	for name, sem := range w.env.Semaphores {
		if n, ok, err := limitOf(ctx, sem); err == nil && ok {
			out[name] = n
		}
	}
	return out
}

// limitOf reads sem's limit (Semaphore.Limit) within 5 s.
func limitOf(ctx context.Context, sem *semaphore.Semaphore) (int, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return sem.Limit(ctx)
}

// watchLimits logs how the fleet-wide limits of the worker's semaphores
// change, from those it found at start: an operator's 'scheduler permits
// set' at info; and at warn, a limit that Redis lost (a restart without
// persistence, a FLUSHDB, a failover to a replica that lacked it), which
// the next call of any worker sets again from its own Config.Permits —
// quietly undoing the operator's limit, which protects the database. In
// auto mode the controller moves the limit and logs its moves: the watch
// says only that the mode began.
func (w *running) watchLimits(ctx context.Context, last map[string]int) {
	t := time.NewTicker(w.cfg.limitCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, name := range slices.Sorted(maps.Keys(w.env.Semaphores)) {
			n, ok, err := limitOf(ctx, w.env.Semaphores[name])
			prev, seen := last[name]
			own := w.cfg.Permits[name]
			if w.inAutoMode(ctx, name) {
				last[name] = n
				continue
			}
			switch {
			case err != nil: // Redis away: the rest of the worker says so
			case !ok:
				if seen {
					w.cfg.Logger.Warn("worker: semaphore "+strconv.Quote(name)+" has lost its limit in Redis (a restart without persistence, a FLUSHDB, a failover): "+
						"the next permit asked for sets it again from that worker's own setting; set the fleet's with: scheduler permits set "+name+" N",
						"semaphore", name, "limit_was", prev, "this_workers_setting", own)
					delete(last, name)
				}
			case !seen:
				w.cfg.Logger.Info("worker: semaphore "+strconv.Quote(name)+"'s limit set", "semaphore", name, "limit", n)
				last[name] = n
			case n == prev:
			case n == own:
				w.cfg.Logger.Warn("worker: semaphore "+strconv.Quote(name)+"'s limit changed to this worker's own setting: unless an operator set it, Redis lost the limit "+
					"(a restart without persistence, a FLUSHDB, a failover) and a worker set it again from its flags; set the fleet's with: scheduler permits set "+name+" N",
					"semaphore", name, "limit_was", prev, "limit", n)
				last[name] = n
			default:
				w.cfg.Logger.Info("worker: semaphore "+strconv.Quote(name)+"'s limit changed", "semaphore", name, "limit_was", prev, "limit", n)
				last[name] = n
			}
		}
	}
}

// inAutoMode reports whether the semaphore name is in auto or shadow
// mode, saying so once when it enters it (a failed read: no).
func (w *running) inAutoMode(ctx context.Context, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	mode, err := w.env.Semaphores[name].Mode(ctx)
	auto := err == nil && mode != semaphore.ModeFixed
	if auto && !w.auto[name] {
		w.cfg.Logger.Info("worker: semaphore "+strconv.Quote(name)+" is in "+string(mode)+" mode: the controller moves its limit within the operator's bounds (scheduler permits get "+name+")",
			"semaphore", name)
	}
	w.auto[name] = auto
	return auto
}
