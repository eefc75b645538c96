package mapreduce

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBatch bounds the calls one round trip carries; calls past it go in
// the next one, at once.
const maxBatch = 256

// batchTimeout bounds one round trip for a client that honours contexts
// (redis.Options.ContextTimeoutEnabled): as long as a record may take
// after its handler's work (afterWork).
const batchTimeout = 30 * time.Second

// A batcher sends the Redis commands of a process's concurrent handlers
// together: a call made while a round trip is under way waits for it to
// end and then goes, in one pipeline, with every call that waited with it.
// A call made while none is under way goes at once, so an idle worker
// waits for nothing, and a busy one pays one round trip (its syscalls on
// both sides, which are most of what a short command costs Redis) for
// several handlers. Each call's commands are its own: they succeed or
// fail one by one, as they would sent alone.
//
// A page's first read and its record go this way, and so does asynq's
// enqueue of the page (batchedScripts). Alone they were three of a page's
// five round trips, asynq's dequeue and done being the others; batched, a
// no-op page costs 3.2 round trips at asynq concurrency 32 (mrbench's
// overhead section): a page's read and record share a round trip with
// another handler's on average, a serial dequeue starting handlers one by
// one, and a split's enqueues go up to EnqueueConcurrency to a trip.
type batcher struct {
	rdb      redis.UniversalClient
	tag      string // the hash tag of the batcher's keys
	replicas replicas

	mu      sync.Mutex
	waiting []*batchCall
	sending bool
}

// batcherIn returns m's batcher for key, made on rdb the first time.
func batcherIn(m *sync.Map, key string, rdb redis.UniversalClient) *batcher {
	if b, ok := m.Load(key); ok {
		return b.(*batcher)
	}
	b, _ := m.LoadOrStore(key, &batcher{rdb: rdb, tag: key})
	return b.(*batcher)
}

// unsent returns a command that carries err, for a call whose own command
// was not sent, or may still be under way: its caller must not read that.
func unsent(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// batchedScripts is the Redis client the Client's asynq.Client enqueues
// through: the caller's, except that EVALSHA, which asynq sends its
// enqueue script with, goes by a batcher. A split enqueues a window's pages
// EnqueueConcurrency at a time, and each asynq enqueue alone is a round
// trip; this way those made together share one (BENCHMARKS.md,
// "Framework overhead": 3.2 round trips per one-page task). Each command keeps its own reply and error,
// so asynq reads it as if sent alone, with one difference: go-redis sends
// a whole pipeline again when its first reply is a retryable error or the
// read times out, and an enqueue of the trip that had run then answers
// that its task ID is taken. The package takes a taken ID as enqueued, as
// it does when a command sent alone is retried after its reply was lost.
// Everything else asynq sends (the SADD that registers a queue, EVAL after
// NOSCRIPT) goes as rdb sends it.
//
// Not for an asynq server: its processor dequeues one task at a time, and
// a dequeue that waited for a trip of other handlers' "done" calls would
// slow every task (mrbench: 1.74 against 1.46, measured).
type batchedScripts struct {
	redis.UniversalClient
	batches *sync.Map // the first key's hash tag → *batcher
}

func (e batchedScripts) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	// asynq's keys are asynq:{<queue>}:…: one batcher per queue, so that on
	// Redis Cluster a round trip goes to one node.
	tag := ""
	if len(keys) > 0 {
		if i := strings.IndexByte(keys[0], '{'); i >= 0 {
			if j := strings.IndexByte(keys[0][i:], '}'); j > 0 {
				tag = keys[0][i+1 : i+j]
			}
		}
	}
	var cmd *redis.Cmd
	if err := batcherIn(e.batches, tag, e.UniversalClient).do(ctx, func(pl redis.Pipeliner) { cmd = pl.EvalSha(ctx, sha1, keys, args...) }); err != nil {
		return unsent(ctx, err) // not cmd: the call may still be under way, and cmd is its
	}
	return cmd
}

type batchCall struct {
	ctx  context.Context
	fill func(redis.Pipeliner)
	sync bool  // a write exactly-once rests on: it waits for a replica (replicas.go)
	err  error // set if the call was not sent, or its trip failed unsent
	done chan struct{}
}

// do queues fill's commands in the next round trip and returns once they
// are answered, or when ctx ends. fill adds commands to the pipeline it is
// given and keeps them: their errors are the call's. do's error says the
// call's commands were not sent (ctx ended first, a client hook refused the
// pipeline, a panic): read none of them then, as the sender may still be
// filling them in. A command may still run after do returned with ctx's
// error, as a command sent alone may.
func (b *batcher) do(ctx context.Context, fill func(redis.Pipeliner)) error {
	return b.queue(&batchCall{ctx: ctx, fill: fill, done: make(chan struct{})})
}

// doSynced is do for writes that a run's exactly-once rests on: where
// their primary has a replica, they return once one has them, and fail
// with errNotReplicated (transient) if none acknowledges them within
// replicaWait (replicas.go).
func (b *batcher) doSynced(ctx context.Context, fill func(redis.Pipeliner)) error {
	return b.queue(&batchCall{ctx: ctx, fill: fill, sync: true, done: make(chan struct{})})
}

// queue queues call and waits for it, as do.
func (b *batcher) queue(call *batchCall) error {
	ctx := call.ctx
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
		b.trip(calls)
		for _, call := range calls {
			close(call.done)
		}
	}
}

// trip sends calls in one pipeline (tripSynced if one of them is synced).
// A panic in a call's fill or in a client hook fails every call of the
// trip instead of the process.
func (b *batcher) trip(calls []*batchCall) {
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("mapreduce: a batched Redis call panicked: %v", r)
			for _, call := range calls {
				call.err = err
			}
		}
	}()
	if slices.ContainsFunc(calls, func(c *batchCall) bool { return c.sync }) {
		b.tripSynced(calls)
		return
	}
	b.tripOn(b.rdb.Pipeline(), calls)
}

// tripOn sends calls in pl.
func (b *batcher) tripOn(pl redis.Pipeliner, calls []*batchCall) {
	if !b.fill(pl, calls) {
		return
	}
	// The client's read and write timeouts bound the round trip, as they
	// bound every command, and so does batchTimeout where the client
	// honours contexts; a caller that stops waiting leaves on its own
	// context.
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	cmds, err := pl.Exec(ctx)
	b.settle(calls, cmds, err)
}

// fill adds the commands of the calls whose callers still wait to pl, and
// reports whether there were any.
func (b *batcher) fill(pl redis.Pipeliner, calls []*batchCall) bool {
	filled := false
	for _, call := range calls {
		if err := call.ctx.Err(); err != nil {
			call.err = err // its caller has gone: do not send it
			continue
		}
		call.fill(pl)
		filled = true
	}
	return filled
}

// settle gives the calls of a pipeline that failed with no command the
// wiser (a client hook that returned an error without sending) its error.
// Otherwise errors are each command's: each call reads its own.
func (b *batcher) settle(calls []*batchCall, cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, cmd := range cmds {
		if cmd.Err() != nil {
			return
		}
	}
	for _, call := range calls {
		if call.err == nil {
			call.err = err
		}
	}
}

// runScript is script.Run in a batch: EVALSHA, sent with other calls.
func (b *batcher) runScript(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	return b.runScriptAs(ctx, false, script, keys, args...)
}

// runScriptSynced is runScript for a write that a run's exactly-once rests
// on (doSynced).
func (b *batcher) runScriptSynced(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	return b.runScriptAs(ctx, true, script, keys, args...)
}

func (b *batcher) runScriptAs(ctx context.Context, synced bool, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	var sha *redis.Cmd
	if err := b.doScriptAs(ctx, synced, script, func(pl redis.Pipeliner) *redis.Cmd {
		sha = script.EvalSha(ctx, pl, keys, args...)
		return sha
	}); err != nil {
		return unsent(ctx, err) // not sha: the call may still be under way, and sha is its
	}
	return sha
}

// doScript is do for a fill that sends script by EVALSHA and returns that
// command. If Redis does not have the script yet (a new or restarted
// Redis, SCRIPT FLUSH), doScript loads it and sends fill once more: the
// script's body crosses the network once, not with every call that waited.
func (b *batcher) doScript(ctx context.Context, script *redis.Script, fill func(redis.Pipeliner) *redis.Cmd) error {
	return b.doScriptAs(ctx, false, script, fill)
}

func (b *batcher) doScriptAs(ctx context.Context, synced bool, script *redis.Script, fill func(redis.Pipeliner) *redis.Cmd) error {
	do := b.do
	if synced {
		do = b.doSynced
	}
	for loaded := false; ; loaded = true {
		var sha *redis.Cmd
		if err := do(ctx, func(pl redis.Pipeliner) { sha = fill(pl) }); err != nil {
			return err
		}
		if loaded || !redis.HasErrorPrefix(sha.Err(), "NOSCRIPT") {
			return nil
		}
		if err := script.Load(ctx, b.rdb).Err(); err != nil {
			return err
		}
	}
}
