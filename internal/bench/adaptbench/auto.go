package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// hasController: this build runs the auto run.
const hasController = false

// errNoController: this build has no controller to run yet.
var errNoController = errors.New("this build of batchmr has no adaptive controller (semaphore.RunController)")

// report tells the controller how a permit's work ended, before Release.
func report(p *semaphore.Permit, err error) {}

// runController runs the fleet's controller for sem in this process, with
// the pool's probe, until ctx is done.
func runController(ctx context.Context, sem *semaphore.Semaphore, pool *pgxpool.Pool, window time.Duration, log *slog.Logger) error {
	return errNoController
}

// controllerLease is how long the controller's lease lasts: after its
// context ends, the limit must be the fixed N within this plus a window.
func controllerLease(sem *semaphore.Semaphore) time.Duration { return 0 }

// controllerWindow is the controller's window for the flag's value w
// (0: its default).
func controllerWindow(w time.Duration) time.Duration { return w }
