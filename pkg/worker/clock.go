package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/batchmr/batchmr/internal/app"
)

// clockError says what is wrong with a clock offset beyond limit and how
// to fix it; nil if within.
func clockError(off, limit time.Duration) error {
	if off <= limit && off >= -limit {
		return nil
	}
	way, by := "ahead of", off
	if off < 0 {
		way, by = "behind", -off
	}
	return fmt.Errorf("this host's clock is %v %s Redis's (the limit is %v, --max-clock-offset): "+
		"asynq schedules retries and leases tasks on the worker's clock, so tasks of a worker with a skewed clock "+
		"look held for hours after it dies, or are taken from it while it works; "+
		"sync the clock (chrony, systemd-timesyncd or ntpd) and start the worker again",
		by.Round(time.Millisecond), way, limit)
}

// clockCheckEvery is how often a running worker measures its clock
// against Redis's again.
const clockCheckEvery = time.Minute

// watchClock logs an error each time the clock has drifted past the limit
// since the worker started, until ctx is done.
func (w *running) watchClock(ctx context.Context) {
	t := time.NewTicker(clockCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		off, err := app.ClockOffset(cctx, w.rdb, w.cfg.now)
		cancel()
		if err == nil {
			if err := clockError(off, w.cfg.MaxClockOffset); err != nil {
				w.cfg.Logger.Error("worker: "+err.Error(), "offset", off)
			}
		}
	}
}
