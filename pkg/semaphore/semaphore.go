package semaphore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// releaseTimeout bounds the Redis call that gives a permit back when the
// caller's own context can no longer be used for it (Do, a cancelled Acquire).
const releaseTimeout = 5 * time.Second

// A Semaphore is one process's handle on a fleet-wide counting semaphore
// kept in Redis. Every process that calls New with the same Redis, name and
// prefix shares the same permits. A Semaphore is safe for concurrent use; a
// process needs one per semaphore name, however many goroutines use it.
//
// Waiting costs this process one blocking Redis connection in all, however
// many goroutines wait, plus one Redis call per Lease/3 to keep its holders'
// leases and its waiters' places alive. The redis client's pool must
// therefore have room for at least two connections.
type Semaphore struct {
	rdb        redis.UniversalClient
	name       string
	opts       Options
	log        *slog.Logger
	keys       []string
	process    string // this handle's identity in tokens and in its wake list's key
	wakePrefix string
	wakeKey    string
	seq        atomic.Uint64

	mu          sync.Mutex
	waiters     map[string]*waiter
	holders     map[string]*Permit
	closed      bool
	dispatching bool
	watching    bool
	stop        chan struct{}
	wg          sync.WaitGroup
}

// New returns a handle on the semaphore called name in rdb. It does not
// contact Redis: the first Acquire writes opts.Limit to Redis if Redis has no
// limit for name yet. New returns an error for an empty name, a Limit below
// 1, or a Lease below MinLease.
func New(rdb redis.UniversalClient, name string, opts Options) (*Semaphore, error) {
	if rdb == nil {
		return nil, fmt.Errorf("semaphore %q: nil redis client: pass a *redis.Client or *redis.ClusterClient", name)
	}
	opts, err := opts.withDefaults(name)
	if err != nil {
		return nil, err
	}
	base := opts.Prefix + ":{" + name + "}:"
	process := newProcessID()
	return &Semaphore{
		rdb:  rdb,
		name: name,
		opts: opts,
		log:  opts.Logger.With("semaphore", name),
		keys: []string{
			base + "limit", base + "holders", base + "queue", base + "alive",
			base + "info", base + "fence", base + "ticket",
		},
		process:    process,
		wakePrefix: base + "wake:",
		wakeKey:    base + "wake:" + process,
		waiters:    make(map[string]*waiter),
		holders:    make(map[string]*Permit),
		stop:       make(chan struct{}),
	}, nil
}

// newProcessID names this handle in Redis: host and pid, so that Stats tells
// an operator where a holder runs, and random bytes, so that two handles
// never share a wake list.
func newProcessID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	return strings.Map(func(r rune) rune {
		if r == ':' || r == ' ' || r == '{' || r == '}' {
			return '_'
		}
		return r
	}, id)
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Acquire acquires one permit, blocking until it is granted or ctx is done.
// Waiters are granted in the order they asked (FIFO across the fleet). On
// success it returns the Permit, which the caller must Release. On failure it
// returns an error wrapping ctx.Err() (or a permanent Redis error, or
// ErrClosed) and leaves the semaphore unchanged: a permit granted at the same
// moment is given back. While Redis is unreachable Acquire keeps trying until
// ctx is done.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return s.AcquireN(ctx, 1)
}

// AcquireN acquires permits with a total weight of n, blocking until they are
// granted or ctx is done, as Acquire does. A request at the head of the queue
// is not overtaken by lighter requests behind it. n must be at least 1 and
// at most the limit: otherwise AcquireN returns an error at once
// (ErrExceedsLimit for n above the limit).
func (s *Semaphore) AcquireN(ctx context.Context, n int) (*Permit, error) {
	p, err := s.acquire(ctx, n, true)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: acquire: %w", s.name, err)
	}
	return p, nil
}

// TryAcquire acquires one permit only if one is free and nobody is queued,
// without waiting. Otherwise it returns an error wrapping ErrNoPermit.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Permit, error) {
	return s.TryAcquireN(ctx, 1)
}

// TryAcquireN is TryAcquire for a weight of n.
func (s *Semaphore) TryAcquireN(ctx context.Context, n int) (*Permit, error) {
	p, err := s.acquire(ctx, n, false)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: try acquire: %w", s.name, err)
	}
	return p, nil
}

// Do acquires one permit, runs fn with the Permit's context and releases the
// permit when fn returns (or panics). It returns fn's error joined with the
// release's: errors.Is(err, ErrLeaseLost) reports that fn may have run
// without holding the permit to the end.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	p, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		err = errors.Join(err, p.Release(rctx))
	}()
	return fn(p.Context())
}

// SetLimit sets the fleet-wide limit to n for every process at once. When
// the limit rises, waiters that now fit are granted immediately; when it
// falls, holders keep their permits and nobody new is granted until the
// permits held fit under n. Queued requests heavier than n fail with
// ErrExceedsLimit.
func (s *Semaphore) SetLimit(ctx context.Context, n int) error {
	if n < 1 {
		return fmt.Errorf("semaphore %q: set limit %d: the limit must be at least 1", s.name, n)
	}
	if _, err := s.eval(ctx, scriptSetLimit, n); err != nil {
		return fmt.Errorf("semaphore %q: set limit: %w", s.name, err)
	}
	return nil
}

// Close stops this handle's background work. Its queued Acquire calls
// return ErrClosed, its permits are released and their contexts cancelled
// with cause ErrClosed, and later calls return ErrClosed. Other processes
// sharing the semaphore are not affected. Close is idempotent.
func (s *Semaphore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	waiters, holders := s.waiters, s.holders
	s.waiters, s.holders = map[string]*waiter{}, map[string]*Permit{}
	dispatching := s.dispatching
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var errs []error
	for tok, w := range waiters {
		w.ch <- wakeup{err: ErrClosed}
		if _, err := s.releaseToken(ctx, tok); err != nil {
			errs = append(errs, err)
		}
	}
	for tok, p := range holders {
		p.lose(ErrClosed)
		if _, err := s.releaseToken(ctx, tok); err != nil {
			errs = append(errs, err)
		}
	}
	if dispatching {
		// Wake the dispatcher's BLPOP so it sees stop now, not at its timeout.
		_ = s.rdb.RPush(ctx, s.wakeKey, "close").Err()
	}
	s.wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("semaphore %q: close: releasing %d permits and places failed; they return when their leases run out: %w", s.name, len(errs), errors.Join(errs...))
	}
	return nil
}

// waiter is one Acquire call in this process, from before its first Redis
// call until it is granted or gives up.
type waiter struct {
	token string
	ctx   context.Context // the Acquire call's; parent of the Permit's context
	ch    chan wakeup     // room for a requeue notice and the final answer

	// heartbeat is when the last call that set this waiter's heartbeat
	// deadline in Redis was sent; guarded by Semaphore.mu.
	heartbeat time.Time
}

// wakeup is the answer a waiter receives.
type wakeup struct {
	permit  *Permit
	err     error
	requeue bool // Redis dropped our place (heartbeat lost): ask again
}

func (s *Semaphore) newToken(n int) string {
	return s.process + ":" + strconv.FormatUint(s.seq.Add(1), 10) + ":" + strconv.Itoa(n)
}

func (s *Semaphore) acquire(ctx context.Context, n int, wait bool) (*Permit, error) {
	if n < 1 {
		return nil, fmt.Errorf("weight %d is less than 1: ask for at least one permit", n)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := &waiter{token: s.newToken(n), ctx: ctx, ch: make(chan wakeup, 2)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	// Registered before the first call, so that a grant arriving on the wake
	// list before the call returns finds its waiter.
	s.waiters[w.token] = w
	s.mu.Unlock()

	for {
		status, value, limit, sent, err := s.callAcquire(ctx, w, wait)
		if err != nil {
			s.forgetWaiter(w.token)
			// The call may have run in Redis even though its reply was lost.
			go s.releaseDetached(w.token)
			return nil, err
		}
		switch status {
		case acquireGranted:
			s.deliver(w.token, value, sent)
		case acquireQueued:
			s.mu.Lock()
			w.heartbeat = sent
			s.startBackgroundLocked(true)
			s.mu.Unlock()
		case acquireFull:
			s.forgetWaiter(w.token)
			return nil, ErrNoPermit
		case acquireTooHeavy:
			s.forgetWaiter(w.token)
			return nil, fmt.Errorf("%w: asked for %d, the limit is %d", ErrExceedsLimit, n, limit)
		default:
			s.forgetWaiter(w.token)
			return nil, fmt.Errorf("unexpected reply %d from the acquire script", status)
		}
		select {
		case m := <-w.ch:
			if m.requeue {
				continue
			}
			if m.err != nil {
				// Idempotent: makes sure a place re-taken by a retry racing
				// with Close does not linger until its heartbeat runs out.
				go s.releaseDetached(w.token)
			}
			return m.permit, m.err
		case <-ctx.Done():
			s.abandon(ctx, w)
			return nil, ctx.Err()
		}
	}
}

// callAcquire runs acquire.lua for w, retrying transient Redis errors with
// backoff while ctx lives and the caller is willing to wait.
func (s *Semaphore) callAcquire(ctx context.Context, w *waiter, wait bool) (status, value int64, limit int64, sent time.Time, err error) {
	waitFlag := "0"
	if wait {
		waitFlag = "1"
	}
	backoff := 10 * time.Millisecond
	for {
		sent = time.Now()
		var res any
		res, err = s.evalUntil(ctx, w.token, scriptAcquire, w.token, s.opts.Lease.Milliseconds(), s.opts.Lease.Milliseconds(), waitFlag)
		if err == nil {
			vals, ok := res.([]any)
			if !ok || len(vals) != 3 {
				return 0, 0, 0, sent, fmt.Errorf("unexpected reply %v from the acquire script", res)
			}
			status, _ = vals[0].(int64)
			value, _ = vals[1].(int64)
			limit, _ = vals[2].(int64)
			return status, value, limit, sent, nil
		}
		if ctx.Err() != nil {
			if errors.Is(err, ctx.Err()) {
				return 0, 0, 0, sent, err
			}
			return 0, 0, 0, sent, fmt.Errorf("%w (last Redis error: %v)", ctx.Err(), err)
		}
		if !wait || !transient(err) {
			return 0, 0, 0, sent, err
		}
		s.log.Warn("semaphore: acquire: Redis unavailable, retrying", "error", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return 0, 0, 0, sent, fmt.Errorf("%w (last Redis error: %v)", ctx.Err(), err)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// evalUntil runs a script for token but returns as soon as ctx is done, even
// if the client would wait longer (go-redis applies its own read timeout, not
// ctx's, unless the client sets ContextTimeoutEnabled). If ctx ends first
// and token is not empty, whatever the late call did for token is undone when
// it returns.
func (s *Semaphore) evalUntil(ctx context.Context, token string, sc *redis.Script, args ...any) (any, error) {
	if ctx.Done() == nil {
		return s.eval(ctx, sc, args...)
	}
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := s.eval(context.WithoutCancel(ctx), sc, args...)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			r := <-done
			if r.err != nil {
				s.log.Warn("semaphore: a Redis call abandoned at its caller's deadline failed", "error", r.err)
			}
			if token != "" {
				s.releaseDetached(token)
			}
		}()
		return nil, fmt.Errorf("%w (no reply from Redis before the deadline)", ctx.Err())
	}
}

// eval runs a script with the arguments every script shares (see
// scripts/lib.lua). Grants it makes are pushed to wake lists, ours included.
func (s *Semaphore) eval(ctx context.Context, sc *redis.Script, args ...any) (any, error) {
	return s.evalAs(ctx, "", sc, args...)
}

// evalAs is eval for a script that returns the grants it makes to process
// self's waiters instead of pushing them to self's wake list.
func (s *Semaphore) evalAs(ctx context.Context, self string, sc *redis.Script, args ...any) (any, error) {
	argv := make([]any, 0, 4+len(args))
	argv = append(argv, s.wakePrefix, s.opts.Limit, (2 * s.opts.Lease).Milliseconds(), self)
	argv = append(argv, args...)
	return sc.Run(ctx, s.rdb, s.keys, argv...).Result()
}

// releaseToken gives back whatever token holds or waits for in Redis, and
// hands the capacity it frees to this process's own waiters directly when
// they are next in line: no wake-up round trip for a local hand-off. Should
// the reply be lost, the watchdog finds those grants at its next refresh.
func (s *Semaphore) releaseToken(ctx context.Context, token string) (int64, error) {
	res, err := s.evalAs(ctx, s.process, scriptRelease, token)
	if err != nil {
		return 0, err
	}
	vals, _ := res.([]any)
	if len(vals) == 0 || len(vals)%2 != 1 {
		return 0, fmt.Errorf("unexpected reply %v from the release script", res)
	}
	for i := 1; i+1 < len(vals); i += 2 {
		tok, _ := vals[i].(string)
		fence, _ := vals[i+1].(int64)
		s.deliver(tok, fence, time.Time{})
	}
	if len(vals) > 1 {
		// Let the new holder run now, on this thread, rather than after our
		// caller's next Redis call or once an idle thread wakes up.
		runtime.Gosched()
	}
	was, _ := vals[0].(int64)
	return was, nil
}

// releaseDetached gives token back in the background, for a caller that has
// already returned.
func (s *Semaphore) releaseDetached(token string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := s.releaseToken(ctx, token); err != nil {
		s.log.Warn("semaphore: could not give back an abandoned request; it returns when its lease runs out", "token", token, "error", err)
	}
}

// abandon takes a waiter whose context ended out of the process and out of
// Redis, including a permit granted to it in the meantime.
func (s *Semaphore) abandon(ctx context.Context, w *waiter) {
	s.forgetWaiter(w.token)
	select {
	case m := <-w.ch:
		if m.permit != nil {
			s.forgetHolder(w.token)
			m.permit.lose(ctx.Err())
		}
	default:
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.releaseDetached(w.token)
	}()
	// Wait briefly so that Acquire returns with the queue already free of
	// us; never long, so that a Redis outage cannot hold Acquire past ctx.
	select {
	case <-done:
	case <-time.After(100 * time.Millisecond):
	}
}

func (s *Semaphore) forgetWaiter(token string) {
	s.mu.Lock()
	delete(s.waiters, token)
	s.mu.Unlock()
}

func (s *Semaphore) forgetHolder(token string) {
	s.mu.Lock()
	delete(s.holders, token)
	s.mu.Unlock()
}

// deliver turns the local waiter of token into a holder of the permit that
// Redis granted it with fence. leaseFrom is when the call that set the
// holder's lease deadline was sent; zero means the grant's deadline is the
// waiter's heartbeat deadline. A notice for a token that no longer waits is
// ignored.
func (s *Semaphore) deliver(token string, fence int64, leaseFrom time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.waiters[token]
	if !ok {
		// A duplicate notice, or a waiter that gave up: every path that gives
		// up a token releases it itself. Releasing here would race with the
		// owner's own Release of a permit it holds and make that report a
		// lost lease.
		return
	}
	if leaseFrom.IsZero() {
		leaseFrom = w.heartbeat
	}
	delete(s.waiters, token)
	p := newPermit(s, w, fence, leaseFrom.Add(s.opts.Lease))
	s.holders[token] = p
	s.startBackgroundLocked(false)
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

// requeue tells the local waiter of token that Redis dropped its place.
func (s *Semaphore) requeue(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[token]; ok && len(w.ch) == 0 {
		w.ch <- wakeup{requeue: true}
	}
}

// startBackgroundLocked starts the watchdog, and the dispatcher when a
// waiter is queued, the first time each is needed. Processes that never wait
// never hold a blocking connection.
func (s *Semaphore) startBackgroundLocked(queued bool) {
	if s.closed {
		return
	}
	if !s.watching {
		s.watching = true
		s.wg.Add(1)
		go s.watch()
	}
	if queued && !s.dispatching {
		s.dispatching = true
		s.wg.Add(1)
		go s.dispatch()
	}
}
