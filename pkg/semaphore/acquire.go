package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
	"github.com/batchmr/batchmr/internal/drain"
)

// waiter is one Acquire call in this process, from before its first Redis
// call until it is granted or gives up.
type waiter struct {
	weight int
	ctx    context.Context // the Acquire call's; parent of the Permit's context
	// ch has room for a requeue notice and the final answer: a requeue is
	// sent only while ch is empty, the final answer only by whoever takes
	// the waiter out of Semaphore.waiters.
	ch chan wakeup

	// Guarded by Semaphore.mu. token changes when the waiter re-queues, so
	// that a grant meant for its old place can never reach it.
	token string
	// heartbeat is a lower bound on when Redis last set this waiter's
	// heartbeat deadline: the send time of the first attempt, raised to the
	// send time of each call Redis confirmed. A grant's first lease ends at
	// that deadline, so heartbeat + Lease never overstates it.
	heartbeat time.Time
	// known: Redis has confirmed this token (a queued reply, or a grant).
	// Only known waiters are refreshed: a refresh that reached Redis before
	// the token's first acquire call would call it unknown and re-queue a
	// waiter that is about to be queued or granted.
	known bool
	// confirming: a grant of its token waits for a replica to have it
	// (confirmReplicated) before it is handed over.
	confirming bool
	// pending: in Semaphore.pending, waiting for a call to carry its first
	// request (enqueue.go); carried: closed once the call that carries it
	// has returned, nil when none does.
	pending bool
	carried chan struct{}
}

// wakeup is the answer a waiter receives.
type wakeup struct {
	permit  *Permit
	err     error
	requeue bool // Redis dropped our place (heartbeat lost): ask again
	// send: the call that carried our first request failed; ask on our
	// own, as a retry if it may have run.
	send, retry bool
}

func (s *Semaphore) newToken(n int) string {
	return s.process + ":" + strconv.FormatUint(s.seq.Add(1), 10) + ":" + strconv.Itoa(n)
}

func (s *Semaphore) acquire(ctx context.Context, n int, wait bool) (*Permit, error) {
	if n < 1 {
		return nil, fmt.Errorf("weight %d is less than 1: ask for at least one permit", n)
	}
	if n > MaxLimit {
		return nil, fmt.Errorf("%w: asked for %d, more than any limit can be (MaxLimit %d)", ErrExceedsLimit, n, MaxLimit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	notice := drain.From(ctx)
	// draining is the drain this call heeds: none once the work under ctx
	// has held a permit (its drain notice), which goes on to its end.
	draining := s.draining
	if notice != nil && notice.Held.Load() {
		draining = nil
	}
	select {
	case <-draining:
		return nil, refuse(notice)
	default:
	}
	began := time.Now()
	w := &waiter{weight: n, ctx: ctx, ch: make(chan wakeup, 2)}
	// Enlisted before the first call, so that a grant arriving before the
	// call returns finds its waiter.
	if err := s.enlist(w); err != nil {
		return nil, err
	}
	// A first request made behind another waiter of this process may be
	// carried by a later call (enqueue.go): the waiter then waits at once.
	carried := wait && s.deferWaiter(w)
	retry := false
	for {
		token := s.tokenOf(w)
		if carried {
			carried = false
		} else if done, err := s.ask(ctx, w, token, wait, retry); done {
			return nil, err
		}
		retry = false
		select {
		case m := <-w.ch:
			switch {
			case m.send:
				retry = m.retry
			case m.requeue:
				old := s.tokenOf(w) // ask may have re-enlisted w since token was read
				if err := s.enlist(w); err != nil {
					s.giveUp(w)
					return nil, err
				}
				// Redis no longer knows the old token; make sure of it.
				s.spawn(func() { s.releaseDetached(old) })
			case m.err != nil:
				s.giveUp(w) // idempotent: makes sure no place lingers in Redis
				return nil, m.err
			default:
				if o := s.opts.Observer; o != nil {
					o.Granted(s.name, n, time.Since(began))
				}
				if notice != nil {
					notice.Held.Store(true)
				}
				return m.permit, nil
			}
		case <-ctx.Done():
			s.giveUp(w)
			return nil, ctx.Err()
		case <-draining:
			// As if ctx ended: a grant that raced the drain is given back.
			s.giveUp(w)
			return nil, refuse(notice)
		}
	}
}

// ask makes w's acquire call under token and handles its reply. done says
// the Acquire call ends with err; otherwise w waits for its answer (a
// grant, too, reaches it on w.ch).
func (s *Semaphore) ask(ctx context.Context, w *waiter, token string, wait, retry bool) (done bool, err error) {
	for {
		status, value, limit, sent, acked, err := s.callAcquire(ctx, token, wait, retry)
		if err != nil {
			if isOOM(err) {
				// Redis refused the call before it recorded anything of
				// the token's (its place or permit is written after any
				// other write that may grow memory): nothing to give
				// back, and a give-back would leave a tombstone, memory
				// that a Redis over its maxmemory cannot spare.
				s.forgetWaiter(w)
				return true, err
			}
			s.giveUp(w)
			return true, err
		}
		switch status {
		case acquireGranted:
			s.deliver(token, value, sent, acked)
		case acquireQueued:
			s.mu.Lock()
			if s.waiters[token] == w {
				w.heartbeat, w.known = sent, true
			}
			s.startBackgroundLocked()
			s.mu.Unlock()
		case acquireFull: // the script recorded nothing: nothing to give back
			s.forgetWaiter(w)
			return true, ErrNoPermit
		case acquireTooHeavy:
			s.forgetWaiter(w)
			return true, fmt.Errorf("%w: asked for %d, the limit is %d", ErrExceedsLimit, w.weight, limit)
		case acquireUnknown:
			// A retry, and Redis does not know the token: the first call
			// never ran, or its place or permit lapsed while its reply was
			// lost. A wake-up for that place may wait in our list; under a
			// new token it can never be taken for a grant of the place we
			// ask for now.
			if err := s.enlist(w); err != nil {
				s.giveUp(w)
				return true, err
			}
			// Should the first call still land (its reply was lost on the
			// way), it finds the tombstone this give-back leaves and
			// takes nothing (bury, scripts/lib.lua); it was sent once
			// (sentOnce), so no copy of it lands after that.
			old := token
			s.spawn(func() { s.releaseDetached(old) })
			token, retry = s.tokenOf(w), false
			continue
		default:
			s.giveUp(w)
			return true, fmt.Errorf("unexpected reply %d from the acquire script", status)
		}
		return false, nil
	}
}

// refuse notes the refusal in n, if any, and returns ErrDraining.
func refuse(n *drain.Notice) error {
	if n != nil {
		n.Drained.Store(true)
	}
	return ErrDraining
}

// enlist gives w a fresh token and registers it under that token,
// replacing its old one. Only w's own Acquire call enlists it.
func (s *Semaphore) enlist(w *waiter) error {
	token := s.newToken(w.weight)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	var stale []*Permit
	if w.token != "" {
		delete(s.waiters, w.token)
		stale = dropStale(w)
	}
	w.token, w.heartbeat, w.known = token, time.Now(), false
	s.waiters[token] = w
	s.mu.Unlock()
	for _, p := range stale {
		s.forgetHolder(p)
		p.lose(errGivenUp)
	}
	return nil
}

// dropStale takes out of w.ch what was for w's old token, keeping anything
// else, and returns the permits among it. w re-enlists because Redis said
// the old token's place or permit is gone or lapsed (a refresh, or a
// retried acquire), and its caller releases the old token:
//   - a requeue notice: a second refresh's notice can arrive after w read
//     the first and before it re-queued, and read under the new token it
//     would send w to the back of the queue again;
//   - a permit: the dispatcher handed the old token's grant over before
//     Redis let it lapse, while w's acquire call was still being retried.
//     Returned, it would guard work with a permit Redis no longer counts
//     for it, and the new token's grant would reach nobody, its permit
//     refreshed and held until Close.
//
// Called with s.mu held by w's own Acquire call, its only reader: the
// senders send under s.mu, so nothing comes or goes meanwhile.
func dropStale(w *waiter) []*Permit {
	var stale []*Permit
	for range len(w.ch) {
		switch m := <-w.ch; {
		case m.requeue:
		case m.permit != nil:
			stale = append(stale, m.permit)
		default:
			w.ch <- m
		}
	}
	return stale
}

func (s *Semaphore) tokenOf(w *waiter) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return w.token
}

// callAcquire runs acquire.lua for token, retrying transient Redis errors
// with backoff while ctx lives, the Semaphore is open and the caller is
// willing to wait. Retrying is safe: every attempt after the first says it
// retries, which makes the script idempotent per token, and a retry that
// finds the token unknown to Redis gets acquireUnknown rather than a new
// place under the old token.
//
// retry says that an earlier call for token may have run (one that carried
// it, enqueue.go): the first attempt is then a retry too. Without it the
// token must be unknown to Redis: the script then skips looking for it.
//
// acked is what deliver is told of a grant's replication: see askReplica.
func (s *Semaphore) callAcquire(ctx context.Context, token string, wait, retry bool) (status, value int64, limit int64, sent time.Time, acked int, err error) {
	waitFlag := "0"
	if wait {
		waitFlag = "1"
	}
	var bo backoff.Backoff
	for attempt := 1; ; attempt++ {
		sent = time.Now()
		// A retry tells the script that an earlier call may have run: if
		// Redis no longer knows the token, the script must not give it a
		// second place (see acquire.lua).
		retryFlag := "0"
		if retry || attempt > 1 {
			retryFlag = "1"
		}
		var res any
		actx, ack := s.askReplica(ctx)
		res, err = s.evalUntil(actx, token, scriptAcquire, token, s.opts.Lease.Milliseconds(), s.opts.Lease.Milliseconds(), waitFlag, retryFlag)
		if err == nil {
			vals, ok := res.([]any)
			if !ok || len(vals) != 3 {
				return 0, 0, 0, sent, 0, fmt.Errorf("unexpected reply %v from the acquire script", res)
			}
			status, _ = vals[0].(int64)
			value, _ = vals[1].(int64)
			limit, _ = vals[2].(int64)
			return status, value, limit, sent, ack.acked(), nil
		}
		if errors.Is(err, ErrClosed) {
			return 0, 0, 0, sent, 0, err
		}
		if ctx.Err() != nil {
			if errors.Is(err, ctx.Err()) {
				return 0, 0, 0, sent, 0, err
			}
			return 0, 0, 0, sent, 0, fmt.Errorf("%w (last Redis error: %v)", ctx.Err(), err)
		}
		if isOOM(err) {
			// Not transient, and not ours to fix: say what is.
			err = fmt.Errorf("%w (Redis is over its maxmemory and will not take a new permit: free memory or raise maxmemory; see docs/operations.md)", err)
		}
		// A call that may not wait still rides out a blip (a stale pooled
		// connection, a failover's refusal) with a few quick retries:
		// go-redis does not resend an acquire's first attempt (sentOnce).
		if !transient(err) || (!wait && attempt >= tryRetries) {
			return 0, 0, 0, sent, 0, err
		}
		// The wait is cut short when another call of this handle finds
		// Redis back.
		retryIn := bo.Next()
		if attempt == 1 {
			// At debug: the handle's outage log warned of the outage once.
			s.log.Debug("semaphore: acquire: Redis unavailable, retrying", "error", err, "retry_in", retryIn)
		}
		switch perr := s.pause(ctx, retryIn); {
		case errors.Is(perr, ErrClosed):
			return 0, 0, 0, sent, 0, ErrClosed
		case perr != nil:
			return 0, 0, 0, sent, 0, fmt.Errorf("%w (last Redis error: %v)", perr, err)
		}
	}
}

// tryRetries is how many attempts a TryAcquire makes when Redis fails for a
// reason that may pass: as many as go-redis makes by default.
const tryRetries = 4

// forgetWaiter takes w out of the process and drops any permit delivered to
// it in the meantime, giving back in Redis only a permit granted under a
// token it no longer uses. It returns w's current token.
//
// sent reports whether w's current token may have reached Redis; carried,
// if not nil, is closed once the call carrying it has returned.
func (s *Semaphore) forgetWaiter(w *waiter) (token string, sent bool, carried <-chan struct{}) {
	s.mu.Lock()
	token = w.token
	sent = !w.pending
	carried = w.carried
	s.dropPendingLocked(w)
	if s.waiters[token] == w {
		delete(s.waiters, token)
	}
	s.mu.Unlock()
	// No one sends to w.ch once w is out of the map: drain it all.
	for drained := false; !drained; {
		select {
		case m := <-w.ch:
			if p := m.permit; p != nil {
				s.forgetHolder(p)
				p.lose(errGivenUp)
				if p.token != token {
					s.spawn(func() { s.releaseDetached(p.token) })
				}
			}
		default:
			drained = true
		}
	}
	return token, sent, carried
}

// giveUp takes a waiter that will not return a permit out of the process
// and out of Redis: its place in the queue, and any permit granted to it in
// the meantime, however that grant arrived.
func (s *Semaphore) giveUp(w *waiter) {
	token, sent, carried := s.forgetWaiter(w)
	if !sent {
		return // still pending: Redis never heard of it
	}
	done := make(chan struct{})
	s.spawn(func() {
		defer close(done)
		if carried != nil {
			<-carried // the place it may take is given back after it is taken
		}
		s.releaseDetached(token)
	})
	// Wait briefly so that Acquire usually returns with Redis already
	// clean; never long, so that an outage cannot hold Acquire past ctx.
	select {
	case <-done:
	case <-time.After(100 * time.Millisecond):
	}
}

// errGivenUp is the cause of the context of a permit granted to an Acquire
// that gave up at the same moment; nobody sees that permit.
var errGivenUp = errors.New("acquire gave up")

// deliver turns the local waiter of token into a holder of the permit that
// Redis granted it with fence. leaseFrom is when the call that set the
// holder's lease deadline was sent; zero means the grant's deadline is the
// waiter's heartbeat deadline. A notice for a token that no longer waits is
// ignored: every path that gives a token up (or re-queues under a new one)
// releases the old token itself. A grant whose lease may already have run
// out (it waited in the wake list, or its reply was slow, while this process
// was paused) is not handed over; the watchdog is started if need be and
// asked to refresh now, and hands it over if Redis still holds it, or
// re-queues.
//
// acked says whether a replica has the grant (see replicas.go): a grant
// that none is known to have is handed over only once one does.
func (s *Semaphore) deliver(token string, fence int64, leaseFrom time.Time, acked int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.waiters[token]
	if !ok {
		return
	}
	if acked <= 0 {
		if !w.confirming {
			w.confirming = true
			s.spawnLocked(func() {
				err := s.confirmGrant(w.ctx, token, fence, acked)
				s.mu.Lock()
				w.confirming = false
				s.mu.Unlock()
				switch {
				case err == nil:
				case w.ctx.Err() == nil && !errors.Is(err, ErrClosed):
					s.fail(token, fmt.Errorf("making sure a replica has the grant: %w", err))
				}
				// Otherwise the Acquire's context is done, or the handle
				// closed: the Acquire gives the token up.
			})
		}
		return
	}
	if leaseFrom.IsZero() {
		leaseFrom = w.heartbeat
	}
	until := leaseFrom.Add(s.opts.Lease)
	if !until.After(time.Now()) {
		w.known = true // Redis granted it: a refresh will say what became of it
		s.startBackgroundLocked()
		s.kickWatchdog()
		return
	}
	delete(s.waiters, token)
	p := newPermit(s, w, token, fence, until)
	s.holders[token] = p
	s.startBackgroundLocked()
	w.ch <- wakeup{permit: p}
}

// reject fails the local waiter of token: its weight exceeds the limit.
func (s *Semaphore) reject(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[token]; ok {
		delete(s.waiters, token)
		w.ch <- wakeup{err: fmt.Errorf("%w: the limit was lowered below this request's weight", ErrExceedsLimit)}
	}
}

// fail fails the local waiter of token with err; its Acquire gives the
// token up.
func (s *Semaphore) fail(token string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[token]; ok {
		delete(s.waiters, token)
		w.ch <- wakeup{err: err}
	}
}

// requeue tells the local waiter of token that Redis dropped its place.
func (s *Semaphore) requeue(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[token]; ok && len(w.ch) == 0 {
		w.ch <- wakeup{requeue: true}
	}
}

// forgetHolder stops refreshing p, if it is still this process's holder.
func (s *Semaphore) forgetHolder(p *Permit) {
	s.mu.Lock()
	if s.holders[p.token] == p {
		delete(s.holders, p.token)
	}
	s.mu.Unlock()
}

// startBackgroundLocked starts the watchdog and the dispatcher the first
// time this handle waits or holds. Processes that never do never hold a
// blocking connection. A process that only holds needs the dispatcher too:
// its connection is what notices at once that Redis went away (a restart
// without persistence drops every permit), so that the permits' contexts
// are cancelled within moments of Redis's return, not at the next refresh.
func (s *Semaphore) startBackgroundLocked() {
	if s.closed {
		return
	}
	if !s.background {
		s.background = true
		s.wg.Add(2)
		go s.watch()
		go s.dispatch()
	}
}
