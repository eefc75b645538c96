// Package backoff paces the retries of a call that failed for a reason that
// may pass (a server restarting, a network cut), for the packages that
// retry Redis and Postgres calls.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Defaults of Backoff's bounds.
const (
	DefaultMin = 20 * time.Millisecond
	DefaultMax = time.Second
)

// Backoff paces the retries of one caller: the waits double from Min to
// Max, each drawn at random between half and all of it (Jitter), so that
// the processes of a fleet that failed together do not come back in step.
// The zero value is ready to use, with DefaultMin and DefaultMax.
type Backoff struct {
	Min, Max time.Duration // zero: DefaultMin, DefaultMax

	d time.Duration
}

// Next returns the wait before the next retry.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo == 0 {
		lo = DefaultMin
	}
	if hi == 0 {
		hi = DefaultMax
	}
	if b.d == 0 {
		b.d = lo
	}
	w := Jitter(b.d)
	b.d = min(2*b.d, hi)
	return w
}

// Reset starts the waits from Min again, after a call succeeded.
func (b *Backoff) Reset() { b.d = 0 }

// Jitter returns a wait drawn at random between d/2 and d.
func Jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}
