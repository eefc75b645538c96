package semaphore

import (
	"errors"

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
)

// transient reports whether err may go away by itself, so that a blocking
// Acquire keeps trying while its context lives.
func transient(err error) bool { return rediserr.Transient(err) }
