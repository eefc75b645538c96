package mapreduce

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxBatch bounds the calls one round trip carries; calls past it go in
// the next one, at once.
const maxBatch = 256

// A batcher sends the Redis commands of a process's concurrent handlers
// together: a call made while a round trip is under way waits for it to
// end and then goes, in one pipeline, with every call that waited with it.
// A call made while none is under way goes at once, so an idle worker
// waits for nothing, and a busy one pays one round trip (its syscalls on
// both sides, which are most of what a short command costs Redis) for
// several handlers. Each call's commands are its own: they succeed or
// fail one by one, as they would sent alone.
//
// A page's first read and its record go this way. Alone they were two of
// a page's five round trips, asynq's enqueue, dequeue and done being the
// others; batched, a no-op page costs 4.1 round trips at asynq
// concurrency 32 (mrbench's overhead section), a round trip carrying two
// calls on average: a serial dequeue starts handlers one by one.
type batcher struct {
	rdb redis.UniversalClient

	mu      sync.Mutex
	waiting []*batchCall
	sending bool
}

type batchCall struct {
	ctx  context.Context
	fill func(redis.Pipeliner)
	err  error // set if the call was dropped unsent
	done chan struct{}
}

// do queues fill's commands in the next round trip and returns once they
// are answered, or when ctx ends. fill adds commands to the pipeline it is
// given and keeps them: their errors are the call's, and do's error only
// says the call was not sent (ctx ended first). A command may still run
// after do returned with ctx's error, as a command sent alone may.
func (b *batcher) do(ctx context.Context, fill func(redis.Pipeliner)) error {
	call := &batchCall{ctx: ctx, fill: fill, done: make(chan struct{})}
	b.mu.Lock()
	b.waiting = append(b.waiting, call)
	if !b.sending {
		b.sending = true
		go b.send()
	}
	b.mu.Unlock()
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send sends what waits, one pipeline at a time, until nothing does.
func (b *batcher) send() {
	for {
		b.mu.Lock()
		calls := b.waiting
		if len(calls) > maxBatch {
			calls, b.waiting = calls[:maxBatch:maxBatch], calls[maxBatch:]
		} else {
			b.waiting = nil
		}
		if len(calls) == 0 {
			b.sending = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()

		pl := b.rdb.Pipeline()
		for _, call := range calls {
			if err := call.ctx.Err(); err != nil {
				call.err = err // its caller has gone: do not send it
				continue
			}
			call.fill(pl)
		}
		// The client's own read and write timeouts bound the round trip, as
		// they bound every command; a caller that stops waiting leaves on
		// its own context. Errors are each command's.
		_, _ = pl.Exec(context.Background())
		for _, call := range calls {
			close(call.done)
		}
	}
}

// runScript is script.Run in a batch: EVALSHA, and EVAL alone if Redis
// does not have the script yet (after a restart or SCRIPT FLUSH).
func (b *batcher) runScript(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	var cmd *redis.Cmd
	if err := b.do(ctx, func(pl redis.Pipeliner) { cmd = script.EvalSha(ctx, pl, keys, args...) }); err != nil {
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return script.Eval(ctx, b.rdb, keys, args...)
	}
	return cmd
}
