package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The two polling designs from public practice that the utilisation
// benchmark compares against. Both are written here from their published
// descriptions, as baselines only.

// pollingZSet follows asynq's x/rate semaphore: one script removes expired
// entries (client-clock deadlines), counts the set and adds the caller if
// there is room; a caller that gets no token sleeps and tries again.
type pollingZSet struct {
	rdb   *redis.Client
	key   string
	limit int
	sleep time.Duration
	lease time.Duration
}

var zsetAcquire = redis.NewScript(`
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", tonumber(ARGV[2]) - 1)
if redis.call("ZCARD", KEYS[1]) < tonumber(ARGV[1]) then
  redis.call("ZADD", KEYS[1], ARGV[3], ARGV[4])
  return 1
end
return 0`)

func (z *pollingZSet) acquire(ctx context.Context) (func(), error) {
	id := strconv.FormatUint(rand.Uint64(), 36)
	for {
		now := time.Now()
		ok, err := zsetAcquire.Run(ctx, z.rdb, []string{z.key}, z.limit, now.UnixMilli(), now.Add(z.lease).UnixMilli(), id).Int()
		if err != nil {
			return nil, err
		}
		if ok == 1 {
			return func() { z.rdb.ZRem(context.Background(), z.key, id) }, nil
		}
		if err := sleepCtx(ctx, z.sleep); err != nil {
			return nil, err
		}
	}
}

// lockCounter guards a counter with a SET NX lock: take the lock, read the
// counter, increment it if below the limit, drop the lock; back off
// exponentially (with jitter) while the lock is taken or the counter full.
type lockCounter struct {
	rdb      *redis.Client
	lock     string
	counter  string
	limit    int
	min, max time.Duration
}

func (l *lockCounter) acquire(ctx context.Context) (func(), error) {
	backoff := l.min
	for {
		got, err := l.rdb.SetNX(ctx, l.lock, 1, 5*time.Second).Result()
		if err != nil {
			return nil, err
		}
		if got {
			n, err := l.rdb.Get(ctx, l.counter).Int()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			if n < l.limit {
				l.rdb.Incr(ctx, l.counter)
				l.rdb.Del(ctx, l.lock)
				return func() { l.rdb.Decr(context.Background(), l.counter) }, nil
			}
			l.rdb.Del(ctx, l.lock)
		}
		jittered := backoff/2 + time.Duration(rand.Int64N(int64(backoff)))
		if err := sleepCtx(ctx, jittered); err != nil {
			return nil, err
		}
		backoff = min(2*backoff, l.max)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// localBound is no design at all but the bounds the machine sets: each
// process shares out its part of the limit (limit/processes permits) over an
// in-process channel, so a hand-off costs a goroutine wake-up and, with
// ping, one Redis round trip first. No design that must tell Redis about a
// release before the next holder may start can beat the second.
type localBound struct {
	rdb    *redis.Client
	tokens chan struct{}
	ping   bool
}

func newLocalBound(rdb *redis.Client, permits int, ping bool) *localBound {
	b := &localBound{rdb: rdb, tokens: make(chan struct{}, permits), ping: ping}
	for range permits {
		b.tokens <- struct{}{}
	}
	return b
}

func (b *localBound) acquire(ctx context.Context) (func(), error) {
	select {
	case <-b.tokens:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return func() {
		if b.ping {
			b.rdb.Ping(context.Background())
		}
		b.tokens <- struct{}{}
	}, nil
}

// tokenList follows the redis-semaphore gem: the free permits are tokens
// in a list; acquire is a BLPOP on it and release pushes the token back.
// Redis serves blocked clients in the order they blocked, so it is fair,
// and a release reaches the next waiter with no polling; but it has no
// leases (a crashed holder's permit is gone for good) and every waiting
// goroutine holds a blocking connection of its own.
type tokenList struct {
	rdb *redis.Client
	key string
}

func newTokenList(ctx context.Context, rdb *redis.Client, key string, limit int) *tokenList {
	// Only one process seeds the list: the first to create the guard key.
	if ok, err := rdb.SetNX(ctx, key+":seeded", 1, 0).Result(); err == nil && ok {
		for i := range limit {
			rdb.RPush(ctx, key, i)
		}
	}
	return &tokenList{rdb: rdb, key: key}
}

func (t *tokenList) acquire(ctx context.Context) (func(), error) {
	for {
		res, err := t.rdb.BLPop(ctx, time.Second, t.key).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return func() { t.rdb.RPush(context.Background(), t.key, res[1]) }, nil
	}
}

// tokenDispatch is the token list behind one blocking connection per
// process, as batchmr's wake-up is: a dispatcher goroutine BLPOPs the list
// while a goroutine of its process waits, and hands each token to the
// longest-waiting one over a channel. Not a candidate (no leases; FIFO
// within a process, and across processes in the order their dispatchers
// blocked): it measures what a per-process wake path costs beside the
// token list, with Redis doing as little per grant as the token list does.
type tokenDispatch struct {
	list    *tokenList
	waiting chan chan string // local waiters, in arrival order
	script  *redis.Script    // if set, a release pushes the token back by this script
	// ticket, if set, is run by every acquire before it waits: one round
	// trip to a script that does the Redis work of batchmr's queued acquire.
	ticket *redis.Script
	id     string       // this process, in ticket tokens
	seq    atomic.Int64 // ticket tokens' sequence
}

var pushScript = redis.NewScript(`return redis.call('RPUSH', KEYS[1], ARGV[1])`)

// pushScript24 runs 24 other commands first, about as many as a batchmr
// acquire and release run per grant together.
var pushScript24 = redis.NewScript(`
for i = 1, 12 do
  redis.call('TIME')
  redis.call('HGET', KEYS[1] .. ':info', ARGV[1])
end
return redis.call('RPUSH', KEYS[1], ARGV[1])`)

// ticketScript does what a batchmr acquire that finds the semaphore full
// does in Redis (lib.lua's begin, the purge, the retry check, then the
// ticket, the queue entry, the heartbeat and the info entry: ten
// commands), so that token-dispatch-ticket measures the acquire round trip
// that S2's global FIFO ticket costs. Its keys are trimmed by the release
// so that they stay small.
var ticketScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('MGET', KEYS[1] .. ':limit', KEYS[1] .. ':fence', KEYS[1] .. ':held', KEYS[1] .. ':auto')
redis.call('ZCARD', KEYS[1] .. ':holders')
redis.call('ZRANGEBYSCORE', KEYS[1] .. ':holders', '-inf', string.format('%d', now))
redis.call('HGET', KEYS[1] .. ':info', ARGV[1])
local ticket = redis.call('INCR', KEYS[1] .. ':ticket')
redis.call('ZADD', KEYS[1] .. ':queue', string.format('%d', ticket), ARGV[1])
redis.call('ZADD', KEYS[1] .. ':alive', string.format('%d', now + 30000), ARGV[1])
redis.call('HSET', KEYS[1] .. ':info', ARGV[1], string.format('%d', now))
return {0, ticket}`)

// unticketScript is ticketScript's undo, run by the release before it
// pushes the token back (three commands, as a grant's removal of the
// waiter's entries).
var unticketScript = redis.NewScript(`
redis.call('ZREM', KEYS[1] .. ':queue', ARGV[2])
redis.call('ZREM', KEYS[1] .. ':alive', ARGV[2])
redis.call('HDEL', KEYS[1] .. ':info', ARGV[2])
return redis.call('RPUSH', KEYS[1], ARGV[1])`)

func newTokenDispatch(ctx context.Context, rdb *redis.Client, key string, limit int) *tokenDispatch {
	d := &tokenDispatch{list: newTokenList(ctx, rdb, key, limit), waiting: make(chan chan string, 4096)}
	go d.dispatch(ctx)
	return d
}

func (d *tokenDispatch) dispatch(ctx context.Context) {
	conn := d.list.rdb.Conn()
	defer conn.Close()
	for {
		var w chan string
		select {
		case w = <-d.waiting:
		case <-ctx.Done():
			return
		}
		for {
			res, err := conn.BLPop(ctx, time.Second, d.list.key).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return
			}
			w <- res[1]
			runtime.Gosched() // as batchmr's dispatcher: the new holder runs first
			break
		}
	}
}

func (d *tokenDispatch) acquire(ctx context.Context) (func(), error) {
	var me string
	if d.ticket != nil {
		me = strconv.FormatInt(d.seq.Add(1), 10) + ":" + d.id
		if err := d.ticket.Run(ctx, d.list.rdb, []string{d.list.key}, me).Err(); err != nil {
			return nil, err
		}
	}
	w := make(chan string, 1)
	d.waiting <- w
	select {
	case tok := <-w:
		if d.ticket != nil {
			return func() { unticketScript.Run(context.Background(), d.list.rdb, []string{d.list.key}, tok, me) }, nil
		}
		if d.script != nil {
			return func() { d.script.Run(context.Background(), d.list.rdb, []string{d.list.key}, tok) }, nil
		}
		return func() { d.list.rdb.RPush(context.Background(), d.list.key, tok) }, nil
	case <-ctx.Done():
		return nil, ctx.Err() // the run is over; a token sent to w is dropped
	}
}

// ticketWake is a ticket semaphore whose hand-off pushes to the next
// ticket's process, on batchmr's wake path: an acquire takes the next
// ticket and, unless a permit is free for it, records its process under
// it (a three-command script); a release takes the next serving number
// and pushes it onto the wake list of that ticket's process, if the ticket
// was issued (a four-command script); each process's dispatcher pops its
// wake list (BLMPOP … COUNT 64) and hands each number to its waiter.
// Fleet-wide FIFO by ticket. Not a design: no leases, no dead or
// cancelled waiters, no weights, no live limit; it measures what a
// hand-off of a few commands could reach beside the bound.
type ticketWake struct {
	rdb  *redis.Client
	key  string
	wake string

	mu      sync.Mutex
	waiters map[int64]chan struct{}
	ready   map[int64]bool // numbers that came before their waiter registered
}

var ticketWakeAcquire = redis.NewScript(`
local t = redis.call('INCR', KEYS[1])
if t <= tonumber(redis.call('GET', KEYS[2]) or '0') then return {t, 1} end
redis.call('SET', KEYS[3] .. t, ARGV[1])
return {t, 0}`)

// ticketWakeRelease returns the next serving number and 1 if its ticket
// is the caller's own (ARGV[1]): that one is not pushed, the caller hands
// it over in-process, as batchmr's release does.
var ticketWakeRelease = redis.NewScript(`
local s = redis.call('INCR', KEYS[1])
local owner = redis.call('GET', KEYS[2] .. s)
if not owner then return {s, 0} end
redis.call('DEL', KEYS[2] .. s)
if owner == ARGV[1] then return {s, 1} end
redis.call('RPUSH', KEYS[3] .. owner, s)
return {s, 0}`)

func newTicketWake(ctx context.Context, rdb *redis.Client, key string, limit int) *ticketWake {
	rdb.SetNX(ctx, key+":serving", limit, 0)
	w := &ticketWake{rdb: rdb, key: key, wake: strconv.Itoa(os.Getpid()),
		waiters: map[int64]chan struct{}{}, ready: map[int64]bool{}}
	go w.dispatch(ctx)
	return w
}

func (w *ticketWake) dispatch(ctx context.Context) {
	conn := w.rdb.Conn()
	defer conn.Close()
	for ctx.Err() == nil {
		_, vals, err := conn.BLMPop(ctx, time.Second, "left", 64, w.key+":wake:"+w.wake).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return
		}
		for _, v := range vals {
			t, _ := strconv.ParseInt(v, 10, 64)
			w.deliver(t)
		}
		runtime.Gosched() // as batchmr's dispatcher: the new holders run first
	}
}

// deliver hands serving number t to its waiter, or keeps it for a waiter
// whose acquire's reply is not in yet.
func (w *ticketWake) deliver(t int64) {
	w.mu.Lock()
	ch := w.waiters[t]
	delete(w.waiters, t)
	if ch == nil {
		w.ready[t] = true
	}
	w.mu.Unlock()
	if ch != nil {
		ch <- struct{}{}
	}
}

func (w *ticketWake) acquire(ctx context.Context) (func(), error) {
	release := func() {
		res, err := ticketWakeRelease.Run(context.Background(), w.rdb, []string{w.key + ":serving", w.key + ":owner:", w.key + ":wake:"}, w.wake).Int64Slice()
		if err == nil && res[1] == 1 {
			w.deliver(res[0])
		}
	}
	res, err := ticketWakeAcquire.Run(ctx, w.rdb, []string{w.key + ":ticket", w.key + ":serving", w.key + ":owner:"}, w.wake).Int64Slice()
	if err != nil {
		return nil, err
	}
	if res[1] == 1 {
		return release, nil
	}
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.ready[res[0]] {
		delete(w.ready, res[0])
		ch <- struct{}{}
	} else {
		w.waiters[res[0]] = ch
	}
	w.mu.Unlock()
	select {
	case <-ch:
		return release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
