package semaphore

import (
	"context"
	"errors"
	"time"

	"github.com/batchmr/batchmr/internal/rediserr"
)

var (
	// ErrNoPermit is returned by TryAcquire and TryAcquireN when no permit
	// is free, or when others are already queued for one.
	ErrNoPermit = errors.New("no permit available")

	// ErrLeaseLost means a permit stopped being held before it was released:
	// its lease ran out without being refreshed (the process paused, or Redis
	// was unreachable for longer than the lease), so other holders may have
	// been granted its capacity. Work done under the permit may have run
	// concurrently with theirs; a Permit's Fence lets downstream systems
	// reject its late writes.
	ErrLeaseLost = errors.New("lease lost")

	// ErrNotHeld is returned by Release when the permit was already released.
	ErrNotHeld = errors.New("permit not held")

	// ErrExceedsLimit is returned when a request's weight is larger than the
	// fleet-wide limit, so it could never be granted. It is also returned to
	// a queued waiter if the limit is lowered below its weight.
	ErrExceedsLimit = errors.New("weight exceeds the limit")

	// ErrClosed is returned by calls on a closed Semaphore, and to waiters
	// and holders of a Semaphore that is closed under them.
	ErrClosed = errors.New("semaphore closed")

	// ErrDraining is returned by Acquire calls of a Semaphore that is
	// draining (Drain): its process is stopping and starts no new work.
	ErrDraining = errors.New("semaphore draining: this process is stopping")
)

// transient reports whether err may go away by itself, so that a blocking
// Acquire keeps trying while its context lives.
func transient(err error) bool { return rediserr.Transient(err) }

// noReplyError is a Redis call that got no reply before the deadline the
// handle put on it (see bounded): Redis unreachable, or its connection
// blackholed. It is a network timeout, as go-redis's own read timeout is,
// so every caller that retries network errors retries it: an Acquire keeps
// waiting, and mapreduce.IsTransient calls a page's failure transient.
type noReplyError struct{ after time.Duration }

func (e noReplyError) Error() string {
	return "no reply from Redis within " + e.after.String()
}
func (e noReplyError) Timeout() bool   { return true }
func (e noReplyError) Temporary() bool { return true }

// bounded bounds ctx by d for a call of the handle's own, one that no
// caller's context bounds.
func bounded(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, noReplyError{after: d})
}

// ownTimeout turns the error of a call that bounded's deadline cut short
// into a noReplyError; a deadline of the caller's stays what it is.
func ownTimeout(ctx context.Context, err error) error {
	var nr noReplyError
	if err != nil && errors.Is(err, context.DeadlineExceeded) && errors.As(context.Cause(ctx), &nr) {
		return nr
	}
	return err
}
