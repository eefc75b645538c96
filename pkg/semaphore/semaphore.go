package semaphore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/procname"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/redis/go-redis/v9"
)

// releaseTimeout bounds each Redis call that gives a permit back, and other
// calls made for a caller that has moved on.
const releaseTimeout = 5 * time.Second

// releaseWait is how long Release waits for Redis to confirm a release
// before it lets its caller move on and finishes in the background.
const releaseWait = time.Second

// closeWait bounds how long Close waits for this handle's goroutines: each
// ends after one last Redis call, but a call to a Redis that never answers
// lasts as long as the redis client lets it.
const closeWait = 5 * time.Second

// A Semaphore is one process's handle on a fleet-wide counting semaphore
// kept in Redis. Every process that calls New with the same Redis, name and
// prefix shares the same permits. A Semaphore is safe for concurrent use; a
// process needs one per semaphore name, however many goroutines use it.
//
// From its first wait or grant until Close, a handle keeps one blocking
// Redis connection in all, however many goroutines wait or hold — it
// receives grants and notices at once when Redis goes away — plus one Redis
// call per Lease/3 to keep its holders' leases and its waiters' places
// alive. The redis client's pool must therefore have room for at least two
// connections.
type Semaphore struct {
	rdb            redis.UniversalClient
	name           string
	opts           Options
	log            *slog.Logger
	keys           []string
	process        string // this handle's identity in tokens and in its wake list's key
	wakePrefix     string
	wakeKey        string
	seq            atomic.Uint64
	handoffs       atomic.Uint64 // releases that handoff passed straight to the queue's head
	lib            *library      // the function library its scripts run as
	scriptMode     atomic.Int32  // how scripts run: see run
	functionsAfter atomic.Int64  // unix ns before which scripts run with EVALSHA
	replicas       replicas      // the primary's replicas: replicas.go
	waitBound      time.Duration // bounds one WAIT: ReplicaWait, below the client's ReadTimeout

	mu           sync.Mutex
	waiters      map[string]*waiter
	holders      map[string]*Permit
	pending      []*waiter   // waiters whose first request waits for a carrier: enqueue.go
	pendingTimer *time.Timer // sends them after maxPending
	releasing    int         // release calls in flight
	closed       bool
	background   bool // the dispatcher and the watchdog run
	stop         chan struct{}
	draining     chan struct{} // closed by Drain
	drainOnce    sync.Once
	kick         chan struct{}  // asks the watchdog to refresh now
	wg           sync.WaitGroup // dispatcher and watchdog

	// Short-lived goroutines (abandoned calls, background releases) are
	// tracked so that Close can wait for them; after Close has begun
	// waiting, new ones run untracked.
	detached     sync.WaitGroup
	detachedDone bool

	// Whether Redis answers this handle: see outage.go.
	down     atomic.Bool
	healthMu sync.Mutex
	back     chan struct{} // while down: closed when Redis answers again
	outages  *outage.Log   // its warning once per cause, its failures at debug, its end
}

// New returns a handle on the semaphore called name in rdb. It does not
// contact Redis: the first Acquire writes opts.Limit to Redis if Redis has no
// limit for name yet. New returns an error for an empty name, a Limit below
// 1, or a Lease below MinLease. On a *redis.ClusterClient, New adds hooks
// that reload the client's map of slots when a node fails: go-redis would
// otherwise keep dialling a dead primary until the map ages out, a minute
// after a failover promoted its replica.
func New(rdb redis.UniversalClient, name string, opts Options) (*Semaphore, error) {
	if rdb == nil {
		return nil, fmt.Errorf("semaphore %q: nil redis client: pass a *redis.Client or *redis.ClusterClient", name)
	}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		rediserr.ReloadSlotsOnErrors(c)
	}
	opts, err := opts.withDefaults(name)
	if err != nil {
		return nil, err
	}
	base := opts.Prefix + ":{" + name + "}:"
	process := newProcessID()
	log := opts.Logger.With("semaphore", name)
	s := &Semaphore{
		lib:     defaultLibrary,
		rdb:     rdb,
		name:    name,
		opts:    opts,
		log:     log,
		outages: outage.New(log, "semaphore"),
		keys: []string{
			base + "limit", base + "holders", base + "queue", base + "alive",
			base + "info", base + "fence", base + "ticket", base + "held",
			base + "auto", base + "signals", base + "control",
		},
		process:    process,
		wakePrefix: base + "wake:",
		wakeKey:    base + "wake:" + process,
		waiters:    make(map[string]*waiter),
		holders:    make(map[string]*Permit),
		stop:       make(chan struct{}),
		draining:   make(chan struct{}),
		kick:       make(chan struct{}, 1),
	}
	s.replicas.n.Store(-1)
	s.waitBound = opts.ReplicaWait
	if rt := readTimeout(rdb); rt > 0 && s.waitBound > rt/2 {
		s.waitBound = rt / 2 // the read timeout bounds the call that carries the WAIT
	}
	if forceEval {
		s.scriptMode.Store(modeEval)
	}
	return s, nil
}

// forceEval makes every new handle run its scripts with EVALSHA, as on
// Redis < 7. The tests set it (BATCHMR_SEMAPHORE_SCRIPTS=eval) to run the
// whole suite down that path too.
var forceEval = false

// newProcessID names this handle in Redis: host and pid, so that Stats tells
// an operator where a holder runs, and random bytes, so that two handles
// never share a wake list.
func newProcessID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return procname.Prefix(host, os.Getpid()) + hex.EncodeToString(b[:])
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Lease returns how long a permit of this handle stays valid without a
// refresh: Options.Lease, or its default.
func (s *Semaphore) Lease() time.Duration { return s.opts.Lease }

// Acquire acquires one permit, blocking until it is granted or ctx is done.
// Waiters are granted in the order they asked (FIFO across the fleet). On
// success it returns the Permit, which the caller must Release. On failure it
// returns an error wrapping ctx.Err() (or a permanent Redis error, or
// ErrClosed) and takes back what Redis recorded for the call — its place in
// the queue, or a permit granted at the same moment. The take-back is
// finished when Acquire returns if Redis answers within 100ms; otherwise it
// completes in the background, or, if Redis stays unreachable, when the
// place's heartbeat or the permit's lease runs out. While Redis is
// unreachable Acquire keeps retrying until ctx is done or the Semaphore is
// closed. Where the Redis primary has replicas, the Permit is returned
// only once a replica has the grant, or once Options.ReplicaWait has
// passed.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return s.AcquireN(ctx, 1)
}

// AcquireN acquires permits with a total weight of n, blocking until they are
// granted or ctx is done, as Acquire does. A request at the head of the queue
// is not overtaken by lighter requests behind it. n must be at least 1 and
// at most the limit in Redis: otherwise AcquireN returns an error without
// waiting (ErrExceedsLimit for n above the limit: at once above MaxLimit,
// after one round trip otherwise).
func (s *Semaphore) AcquireN(ctx context.Context, n int) (*Permit, error) {
	p, err := s.acquire(ctx, n, true)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: acquire: %w", s.name, err)
	}
	return p, nil
}

// TryAcquire acquires one permit only if one is free and nobody is queued,
// without waiting for one. Otherwise it returns an error wrapping
// ErrNoPermit. A grant still waits for a replica as Acquire's does.
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

// Drain makes the Acquire calls of this Semaphore that wait now, and every
// later one, return ErrDraining at once, giving up their places in the
// queue to the rest of the fleet — except those of a batchmr task that has
// held a permit already, which goes on to its end. Permits
// already held are not touched: their holders release them as usual. A
// process that stops drains its semaphores first, so that work that has
// not got its permit yet goes back to be done elsewhere instead of
// starting, or waiting, during the shutdown. An Acquire that is retrying
// its call against an unreachable Redis sees the drain once its call
// returns. Drain cannot be undone; Close still gives back what is held.
func (s *Semaphore) Drain() {
	s.drainOnce.Do(func() { close(s.draining) })
}

// Do acquires one permit, runs fn with the Permit's context and releases the
// permit when fn returns (or panics), reporting fn's error (Permit.Report). It returns fn's error joined with the
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
		p.Report(err)
		err = errors.Join(err, p.Release(rctx))
	}()
	return fn(p.Context())
}

// SetLimit sets the fleet-wide limit to n for every process at once, and
// makes it fixed: it ends auto mode (SetAuto), if any. When
// the limit rises, waiters that now fit are granted immediately; when it
// falls, holders keep their permits and nobody new is granted until the
// permits held fit under n, and queued requests heavier than n fail at once
// with ErrExceedsLimit, wherever they are in the queue. A limit below 1 or
// above MaxLimit is an error, and changes nothing. Where the Redis primary
// has replicas, SetLimit returns once one of them has the new limit (see
// Options.ReplicaWait), or with an error wrapping ctx's once ctx is done
// before (the limit is set on the primary all the same).
func (s *Semaphore) SetLimit(ctx context.Context, n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("semaphore %q: set limit %d: the limit must be a whole number from 1 to %d (MaxLimit)", s.name, n, MaxLimit)
	}
	_, err := s.evalReplicated(ctx, "set limit", scriptSetLimit, n)
	return err
}

// evalReplicated runs a script that changes the limit or its mode and,
// where the Redis primary has replicas, returns once one of them has the
// change (see Options.ReplicaWait). what names the call in its errors.
func (s *Semaphore) evalReplicated(ctx context.Context, what string, sc *script, args ...any) (any, error) {
	actx, ack := s.askReplica(ctx)
	sent := time.Now()
	res, err := s.eval(actx, sc, args...)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: %s: %w", s.name, what, err)
	}
	if ack != nil {
		if err := s.confirmReplicated(ctx, ack.acked(), sent); err != nil {
			return res, fmt.Errorf("semaphore %q: %s: the change is made, but %w", s.name, what, err)
		}
	}
	return res, nil
}

// Limit returns the fleet-wide limit that Redis holds now; ok is false
// when it holds none (a new semaphore, or Redis lost its keys: a restart
// without persistence, a FLUSHDB, a failover to a replica that lacked it),
// and then the next call of any process sets the limit of its own Options.
// One GET: cheap enough to watch.
func (s *Semaphore) Limit(ctx context.Context) (n int, ok bool, err error) {
	v, err := s.rdb.Get(ctx, s.keys[0]).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("semaphore %q: limit: %w", s.name, err)
	}
	n, err = strconv.Atoi(v)
	if err != nil {
		return 0, false, fmt.Errorf("semaphore %q: limit: Redis holds %q, not a number", s.name, v)
	}
	return n, true, nil
}

// Close stops this handle's background work. Its queued Acquire calls
// (and those retrying against an unreachable Redis) return ErrClosed, its
// permits are released and their contexts cancelled with cause ErrClosed,
// and later Acquire calls return ErrClosed; Stats and SetLimit keep working.
// Other processes sharing the semaphore are not affected. Close is
// idempotent. It waits for this handle's goroutines to end, which takes one
// Redis call: releases still being retried (see Permit.Release) make one
// last attempt, as do the releases of the permits and places Close takes
// back, all at once. If Redis does not answer, Close returns after 5s at
// most, with an error; whatever it could not give back returns to the fleet
// when its lease runs out.
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
	// Pending waiters never reached Redis: nothing to give back. They stay
	// marked pending, so that their own give-up sends nothing either.
	unsent := make(map[*waiter]bool, len(s.pending))
	for _, w := range s.pending {
		unsent[w] = true
	}
	s.pending = nil
	s.stopPendingTimerLocked()
	dispatching := s.background
	s.mu.Unlock()

	ctx := context.Background()
	var results []<-chan giveBackResult
	for tok, w := range waiters {
		w.ch <- wakeup{err: ErrClosed}
		if !unsent[w] {
			results = append(results, s.giveBack(ctx, tok, false, ""))
		}
	}
	for tok, p := range holders {
		// A Release under way owns the permit's release: only give back
		// what Close took over, or that Release would find gone.
		if !p.lose(ErrClosed) {
			continue
		}
		s.observeReleased(p)
		results = append(results, s.giveBack(ctx, tok, false, ""))
	}
	if dispatching {
		s.wakeDispatcher(ctx)
	}
	s.waitGoroutines()
	return s.closeResult(results)
}

// wakeDispatcher wakes the dispatcher's blocking pop so it sees stop now,
// not at its timeout; with a TTL, in case the dispatcher is gone already.
func (s *Semaphore) wakeDispatcher(ctx context.Context) {
	s.spawn(func() {
		ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		_, _ = s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.RPush(ctx, s.wakeKey, "close")
			pipe.PExpire(ctx, s.wakeKey, 2*s.opts.Lease)
			return nil
		})
	})
}

// waitGoroutines waits, closeWait at most, for this handle's goroutines
// and then its detached Redis calls to end.
func (s *Semaphore) waitGoroutines() {
	ended := make(chan struct{})
	go func() {
		s.wg.Wait()
		s.mu.Lock()
		s.detachedDone = true
		s.mu.Unlock()
		s.detached.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(closeWait):
		s.log.Warn("semaphore: Close stopped waiting for Redis calls that did not end; they end when the redis client gives up on them", "waited", closeWait)
	}
}

// closeResult is Close's error: the give-backs in results that failed or
// have not answered yet.
func (s *Semaphore) closeResult(results []<-chan giveBackResult) error {
	var errs []error
	for _, r := range results {
		select {
		case r := <-r:
			if r.err != nil {
				errs = append(errs, r.err)
			}
		default:
			errs = append(errs, fmt.Errorf("no answer from Redis within %v", closeWait))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("semaphore %q: close: releasing %d permits and places failed; they return when their leases run out: %w", s.name, len(errs), errors.Join(errs...))
	}
	return nil
}
