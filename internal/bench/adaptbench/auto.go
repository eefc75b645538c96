package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultWindow is ControllerOptions.Window's default.
const defaultWindow = time.Second

// runController runs the fleet's controller for sem in this process, with
// a probe of the pool's server, until ctx is done.
func runController(ctx context.Context, sem *semaphore.Semaphore, pool *pgxpool.Pool, window time.Duration, log *slog.Logger) error {
	probe := pgsource.NewProbe(pool)
	defer probe.Close()
	return sem.RunController(ctx, semaphore.ControllerOptions{Window: window, Probe: probe.Run, Logger: log})
}

// controllerWindow is the controller's window for the flag's value w
// (0: its default).
func controllerWindow(w time.Duration) time.Duration {
	if w <= 0 {
		return defaultWindow
	}
	return w
}

// controllerLease is how long the controller's lease lasts: three
// windows (RunController). Once its context ends, the limit must be the
// fixed N again within this plus a window.
func controllerLease(window time.Duration) time.Duration { return 3 * window }
