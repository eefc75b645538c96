package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
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
	w := make(chan string, 1)
	d.waiting <- w
	select {
	case tok := <-w:
		if d.script != nil {
			return func() { d.script.Run(context.Background(), d.list.rdb, []string{d.list.key}, tok) }, nil
		}
		return func() { d.list.rdb.RPush(context.Background(), d.list.key, tok) }, nil
	case <-ctx.Done():
		return nil, ctx.Err() // the run is over; a token sent to w is dropped
	}
}
