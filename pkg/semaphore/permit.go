package semaphore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errReleased is the cause of a Permit's context after Release.
var errReleased = errors.New("permit released")

type permitState int

const (
	permitHeld permitState = iota
	permitReleased
	permitLost   // lease ran out, or the Acquire gave up at the moment of the grant
	permitClosed // the Semaphore was closed
)

// A Permit is a granted share of the semaphore, held until Release. Its
// lease is refreshed in the background while it is held.
type Permit struct {
	sem     *Semaphore
	token   string
	fence   int64
	weight  int
	granted time.Time // when this process received the grant
	ctx     context.Context
	cancel  context.CancelCauseFunc

	mu      sync.Mutex
	state   permitState
	until   time.Time // local time until which the lease is known to be valid
	outcome byte      // what Report said: outcomeOK unless it said otherwise
}

func newPermit(s *Semaphore, w *waiter, token string, fence int64, until time.Time) *Permit {
	ctx, cancel := context.WithCancelCause(context.WithValue(w.ctx, heldKey{s}, true))
	return &Permit{sem: s, token: token, fence: fence, weight: w.weight, granted: time.Now(), ctx: ctx, cancel: cancel, until: until, outcome: outcomeOK}
}

// heldKey marks a Permit's context as that of a permit of sem.
type heldKey struct{ sem *Semaphore }

// Holding reports whether ctx is a context of a permit of s (Permit.Context,
// the function's context in Do), or derives from one: whether work under
// ctx already holds one of s's permits. A second Acquire of s under such a
// context waits for a permit while holding one, which, once every holder
// does the same, waits for ever; code that may be called either way can
// check first.
func Holding(ctx context.Context, s *Semaphore) bool {
	return ctx.Value(heldKey{s}) != nil
}

// Context returns a context that is done when the permit is released, when
// its lease is lost (context.Cause returns ErrLeaseLost), when its Semaphore
// is closed (cause ErrClosed), or when the context given to Acquire is done.
// Pass it to the work the permit guards, so that work stops when the permit
// may no longer be held.
func (p *Permit) Context() context.Context { return p.ctx }

// Fence returns the permit's grant number. Every grant of the semaphore gets
// a larger fence than every grant before it, across the fleet, so a storage
// system that remembers the largest fence it has seen can refuse writes from
// a holder whose lease was lost.
func (p *Permit) Fence() int64 { return p.fence }

// ID returns the permit's token, as shown in Stats.
func (p *Permit) ID() string { return p.token }

// Release gives the permit back and cancels its context; the capacity goes
// to the oldest waiter at once. It returns nil if the permit was held until
// now, an error wrapping ErrLeaseLost if its lease was lost before (the
// permit is given back all the same, if Redis still had it), ErrClosed if its
// Semaphore was closed (which released it), and ErrNotHeld if it was already
// released.
//
// Release waits for Redis to confirm the release while ctx lives, but for
// 1s at most (the full second if ctx is already done — the permit's own
// context after a lost lease, say). If Redis cannot be reached, or is
// restarting or failing over, or has not answered by then, Release returns
// without its answer — nil if the lease this process knows was still
// running when Release was called, ErrLeaseLost otherwise — and goes on
// giving the permit back in the background, retrying with backoff (tens of
// milliseconds, growing to a second) until Redis answers, past the
// permit's lease too (Redis keeps a live process's lapsed permit for one
// more lease), so that the capacity returns to the fleet moments after
// Redis does, not a lease later. Close ends these retries after one last
// attempt. An error Redis answers that retrying cannot fix (WRONGTYPE,
// NOPERM) is returned; the permit then returns when its lease runs out.
func (p *Permit) Release(ctx context.Context) error {
	called := time.Now()
	p.mu.Lock()
	state := p.state
	if state == permitHeld || state == permitLost {
		p.state = permitReleased
	}
	report := fmt.Sprintf("%d:%c", called.Sub(p.granted).Milliseconds(), p.outcome)
	p.mu.Unlock()
	name := p.sem.name
	switch state {
	case permitReleased:
		return fmt.Errorf("semaphore %q: release: %w", name, ErrNotHeld)
	case permitClosed:
		return fmt.Errorf("semaphore %q: release: %w", name, ErrClosed)
	}
	p.sem.forgetHolder(p)
	p.sem.observeReleased(p)
	// A permit whose lease Redis cannot have let lapse before the call
	// arrives may go straight to the next waiter (releaseToken).
	handoff := state == permitHeld && !p.expired(called.Add(expiryMargin(p.sem.opts.Lease)))
	answer := p.sem.giveBack(ctx, p.token, handoff, report)
	var done <-chan struct{} // nil, never ready, if ctx is already done
	if ctx.Err() == nil {
		done = ctx.Done()
	}
	wait := time.NewTimer(releaseWait)
	defer wait.Stop()
	var r giveBackResult
	select {
	case r = <-answer:
	case <-wait.C:
		r.retrying = true
	case <-done:
		r.retrying = true
	}
	p.cancel(errReleased)
	answered := !r.retrying && r.err == nil
	switch {
	case answered && (state == permitLost || r.was != releaseHeld):
		return fmt.Errorf("semaphore %q: release: %w", name, ErrLeaseLost)
	case answered:
		return nil
	case state == permitLost || p.expired(called):
		// Without Redis's word, the lease this process knows decides.
		if r.retrying {
			return fmt.Errorf("semaphore %q: release: %w (Redis has not confirmed the release yet; it is retried in the background)", name, ErrLeaseLost)
		}
		return fmt.Errorf("semaphore %q: release: %w (giving it back failed too: %v)", name, ErrLeaseLost, r.err)
	case r.retrying:
		return nil
	}
	return fmt.Errorf("semaphore %q: release: %w (the permit returns to the fleet when its lease runs out)", name, r.err)
}

// Report tells the permit how the work it guards ended, for the
// controller of auto mode (SetAuto); Release sends it with the permit, at
// no extra round trip. nil is a success, whose time from grant to release
// is a latency sample; a timeout (context.DeadlineExceeded, an error whose
// Timeout method says so, or a Postgres error whose SQLSTATE is a
// statement or lock timeout or a lack of resources) is a sign of overload;
// a cancel (context.Canceled) says nothing of the database; any other
// error is counted as an error, never as a latency sample. A permit
// released without a Report reports a success: report errors. Do reports
// its function's error itself. The last Report before Release counts.
func (p *Permit) Report(err error) {
	p.mu.Lock()
	p.outcome = outcomeOf(err)
	p.mu.Unlock()
}

// lose marks a held permit as no longer held and cancels its context. It
// reports whether the permit was held, that is whether the caller now owns
// giving it back. Otherwise it does nothing: a concurrent Release owns the
// permit, and may be using its context for the call that gives it back.
func (p *Permit) lose(cause error) bool {
	p.mu.Lock()
	held := p.state == permitHeld
	if held {
		p.state = permitLost
		if errors.Is(cause, ErrClosed) {
			p.state = permitClosed
		}
	}
	p.mu.Unlock()
	if held {
		// Observed first, so that whoever sees the context done sees the loss counted.
		if o := p.sem.opts.Observer; o != nil && errors.Is(cause, ErrLeaseLost) {
			o.LeaseLost(p.sem.name, p.weight)
		}
		p.cancel(cause)
	}
	return held
}

// expired reports whether the lease is past the last deadline this process
// knows Redis to have accepted.
func (p *Permit) expired(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return now.After(p.until)
}

// deadline is the last lease deadline this process knows Redis accepted.
func (p *Permit) deadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.until
}

// extend records a refresh that Redis accepted.
func (p *Permit) extend(until time.Time) {
	p.mu.Lock()
	if until.After(p.until) {
		p.until = until
	}
	p.mu.Unlock()
}

// observeReleased tells the Observer that p is no longer held here.
func (s *Semaphore) observeReleased(p *Permit) {
	if o := s.opts.Observer; o != nil {
		o.Released(s.name, p.weight, time.Since(p.granted))
	}
}
