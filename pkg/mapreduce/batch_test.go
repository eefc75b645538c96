package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// tripHook counts the pipelines a client sends and how many commands each
// carries; while hold is set, the next pipeline waits until it is closed.
// A new connection's handshake, which go-redis sends as a pipeline too, is
// neither counted nor held.
type tripHook struct {
	mu     sync.Mutex
	trips  []int
	hold   chan struct{}
	refuse error // returned for every pipeline, which is not sent
}

func (h *tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}

func (h *tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		switch cmds[0].Name() {
		case "hello", "auth", "client", "select":
			return next(ctx, cmds)
		}
		h.mu.Lock()
		h.trips = append(h.trips, len(cmds))
		hold, refuse := h.hold, h.refuse
		h.hold = nil
		h.mu.Unlock()
		if hold != nil {
			<-hold
		}
		if refuse != nil {
			return refuse
		}
		return next(ctx, cmds)
	}
}

func (h *tripHook) sent() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.trips...)
}

// newHeldBatcher returns a batcher on a client of its own, the test's key
// prefix, and the hook that counts the client's round trips and holds the
// first one until release is closed.
func newHeldBatcher(t *testing.T) (b *batcher, prefix string, hook *tripHook, release chan struct{}) {
	rdb, prefix := testenv.Redis(t)
	hook = &tripHook{hold: make(chan struct{})}
	rdb.AddHook(hook)
	return &batcher{rdb: rdb}, prefix, hook, hook.hold
}

func (b *batcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting)
}

// Calls made while a round trip is under way go together in the next one,
// and each gets its own replies.
func TestBatcherSendsCallsThatWaitedInOneRoundTrip(t *testing.T) {
	b, prefix, hook, release := newHeldBatcher(t)
	ctx := context.Background()

	const n = 20
	got := make([]int64, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	call := func(i int) {
		defer wg.Done()
		var incr *redis.IntCmd
		key := prefix + ":n:" + strconv.Itoa(i)
		errs[i] = b.do(ctx, func(pl redis.Pipeliner) {
			pl.Set(ctx, key, i*10, 0)
			incr = pl.Incr(ctx, key)
		})
		if errs[i] == nil {
			got[i], errs[i] = incr.Result()
		}
	}
	wg.Add(1)
	go call(0) // its round trip is held in the hook
	testenv.WaitFor(t, 10*time.Second, "the first round trip to start", func() bool { return len(hook.sent()) == 1 })
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go call(i)
	}
	testenv.WaitFor(t, 10*time.Second, "the other calls to queue", func() bool { return b.queued() == n })
	close(release)
	wg.Wait()

	for i := range got {
		if errs[i] != nil || got[i] != int64(i*10+1) {
			t.Errorf("call %d: got %d, %v; want %d", i, got[i], errs[i], i*10+1)
		}
	}
	if trips := hook.sent(); len(trips) != 2 || trips[0] != 2 || trips[1] != 2*n {
		t.Fatalf("round trips (commands in each) = %v, want [2 %d]: the %d calls that waited should go together", trips, 2*n, n)
	}
}

// One call's failing command fails that call only.
func TestBatcherKeepsEachCallsErrorsItsOwn(t *testing.T) {
	b, prefix, hook, release := newHeldBatcher(t)
	rdb, ctx := b.rdb, context.Background()
	if err := rdb.HSet(ctx, prefix+":hash", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	var bad, good *redis.IntCmd
	wg.Add(1)
	go func() { // held: the next two go together
		defer wg.Done()
		_ = b.do(ctx, func(pl redis.Pipeliner) { pl.Exists(ctx, prefix+":x") })
	}()
	testenv.WaitFor(t, 10*time.Second, "the first round trip to start", func() bool { return len(hook.sent()) == 1 })
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = b.do(ctx, func(pl redis.Pipeliner) { bad = pl.Incr(ctx, prefix+":hash") }) // WRONGTYPE
	}()
	go func() {
		defer wg.Done()
		_ = b.do(ctx, func(pl redis.Pipeliner) { good = pl.Incr(ctx, prefix+":counter") })
	}()
	testenv.WaitFor(t, 10*time.Second, "both calls to queue", func() bool { return b.queued() == 2 })
	close(release)
	wg.Wait()

	if trips := hook.sent(); len(trips) != 2 {
		t.Fatalf("round trips = %v, want 2: the two calls should go together", trips)
	}
	if !redis.HasErrorPrefix(bad.Err(), "WRONGTYPE") {
		t.Errorf("INCR of a hash: err = %v, want WRONGTYPE", bad.Err())
	}
	if v, err := good.Result(); err != nil || v != 1 {
		t.Errorf("the other call's INCR = %d, %v; want 1, nil", v, err)
	}
}

// A call whose caller gave up while it waited is not sent.
func TestBatcherDropsACallWhoseContextEndedBeforeItWasSent(t *testing.T) {
	b, prefix, hook, release := newHeldBatcher(t)
	rdb := b.rdb

	done := make(chan error, 1)
	go func() {
		done <- b.do(context.Background(), func(pl redis.Pipeliner) { pl.Exists(context.Background(), prefix+":x") })
	}()
	testenv.WaitFor(t, 10*time.Second, "the first round trip to start", func() bool { return len(hook.sent()) == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		gaveUp <- b.do(ctx, func(pl redis.Pipeliner) { pl.Set(ctx, prefix+":dropped", "1", 0) })
	}()
	testenv.WaitFor(t, 10*time.Second, "the second call to queue", func() bool { return b.queued() == 1 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("do with a cancelled context = %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the sender to finish", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return !b.sending
	})
	if n, err := rdb.Exists(context.Background(), prefix+":dropped").Result(); err != nil || n != 0 {
		t.Fatalf("the dropped call's SET ran (exists = %d, %v)", n, err)
	}
}

// runScript works for a script Redis has never seen: EVALSHA fails with
// NOSCRIPT in the pipeline, and the script is sent whole.
func TestBatcherRunsAScriptRedisDoesNotHaveYet(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	b := &batcher{rdb: rdb}
	ctx := context.Background()
	// A body no other test sends, so Redis cannot have it cached.
	script := redis.NewScript(fmt.Sprintf("-- %s %d\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])", prefix, time.Now().UnixNano()))
	for want := int64(5); want <= 10; want += 5 {
		if v, err := b.runScript(ctx, script, []string{prefix + ":s"}, 5).Int64(); err != nil || v != want {
			t.Fatalf("runScript = %d, %v; want %d, nil", v, err, want)
		}
	}
}

// With Redis unreachable every call fails with the connection's error,
// which withRedis knows as transient, and nothing hangs.
func TestBatcherFailsEachCallWhenRedisIsUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	b := &batcher{rdb: rdb}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cmd *redis.StringCmd
			if err := b.do(ctx, func(pl redis.Pipeliner) { cmd = pl.Get(ctx, "k"+strconv.Itoa(i)) }); err != nil {
				t.Errorf("call %d: do = %v, want nil (the call was sent; its command carries the error)", i, err)
				return
			}
			var op *net.OpError
			if !errors.As(cmd.Err(), &op) {
				t.Errorf("call %d: GET with Redis down: err = %v, want a connection error", i, cmd.Err())
			}
		}()
	}
	wg.Wait()
}

// A pipeline that a client hook refuses, without sending it and so
// without setting any command's error, fails every call with the hook's
// error: no call reads commands that never ran as a success.
func TestBatcherFailsEveryCallOfAPipelineAHookRefused(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	refused := errors.New("circuit open")
	rdb.AddHook(&tripHook{refuse: refused})
	b := &batcher{rdb: rdb}
	ctx := context.Background()
	var fields *redis.SliceCmd
	err := b.do(ctx, func(pl redis.Pipeliner) { fields = pl.HMGet(ctx, prefix+":run", "state", "nonce") })
	if !errors.Is(err, refused) {
		t.Fatalf("do = %v (HMGET: %v, %d values), want the hook's error", err, fields.Err(), len(fields.Val()))
	}
	if cmd := b.runScript(ctx, scriptRecord, []string{prefix + ":a", prefix + ":b", prefix + ":c", prefix + ":d"}, 0, "x", "0", "n"); !errors.Is(cmd.Err(), refused) {
		t.Fatalf("runScript's error = %v, want the hook's", cmd.Err())
	}
}

// A panic while a round trip is made fails the calls of that trip, not
// the process, and the batcher goes on working.
func TestBatcherTurnsAPanicIntoTheErrorOfItsTripsCalls(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	b := &batcher{rdb: rdb}
	ctx := context.Background()
	err := b.do(ctx, func(redis.Pipeliner) { panic("a bug") })
	if err == nil || !strings.Contains(err.Error(), "a bug") {
		t.Fatalf("do with a panicking fill = %v, want an error naming the panic", err)
	}
	var incr *redis.IntCmd
	if err := b.do(ctx, func(pl redis.Pipeliner) { incr = pl.Incr(ctx, prefix+":after") }); err != nil || incr.Val() != 1 {
		t.Fatalf("the next call: do = %v, INCR = %d; want nil, 1", err, incr.Val())
	}
}

// newHeldClient returns a Client on a Redis client whose first round trip
// the returned hook holds until release is closed, and a queue of the
// test's own. asynq's first enqueue to a queue registers it with an
// SADD sent alone, which the hook neither counts nor holds: it counts
// pipelines.
func newHeldClient(t *testing.T) (c *Client, queue string, hook *tripHook, release chan struct{}) {
	rdb, prefix := testenv.Redis(t)
	queue = testenv.Queue(t, rdb, prefix)
	hook = &tripHook{hold: make(chan struct{})}
	rdb.AddHook(hook)
	c, err := New(rdb, Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return c, queue, hook, hook.hold
}

func (e batchedScripts) queued(tag string) int {
	b, ok := e.batches.Load(tag)
	if !ok {
		return 0
	}
	return b.(*batcher).queued()
}

// Enqueues made while one is under way go together in the next round
// trip, and each task is enqueued as sent, with its own ID and payload;
// an ID taken twice in one trip is a conflict for one of the two only.
func TestEnqueuesMadeTogetherShareARoundTrip(t *testing.T) {
	c, queue, hook, release := newHeldClient(t)
	ctx := context.Background()

	const n = 20
	errs := make([]error, n+2)
	var wg sync.WaitGroup
	enqueue := func(slot int, id string) {
		defer wg.Done()
		_, errs[slot] = c.aq.EnqueueContext(ctx, asynq.NewTask("t", []byte("payload "+id)), asynq.Queue(queue), asynq.TaskID(id))
	}
	wg.Add(1)
	go enqueue(0, "0") // its round trip is held in the hook
	testenv.WaitFor(t, 10*time.Second, "the first round trip to start", func() bool { return len(hook.sent()) == 1 })
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go enqueue(i, strconv.Itoa(i))
	}
	wg.Add(1)
	go enqueue(n+1, "7") // the same ID as another in the same trip
	testenv.WaitFor(t, 10*time.Second, "the other enqueues to queue", func() bool { return c.enqueue.queued(queue) == n+1 })
	close(release)
	wg.Wait()

	if trips := hook.sent(); len(trips) != 2 || trips[0] != 1 || trips[1] != n+1 {
		t.Fatalf("round trips (commands in each) = %v, want [1 %d]: the enqueues that waited should go together", trips, n+1)
	}
	conflicts := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, asynq.ErrTaskIDConflict) && (i == 7 || i == n+1):
			conflicts++
		case err != nil:
			t.Errorf("enqueue %d: %v", i, err)
		}
	}
	if conflicts != 1 {
		t.Errorf("%d of the two enqueues of task 7 got ErrTaskIDConflict, want exactly 1", conflicts)
	}
	for i := 0; i <= n; i++ {
		id := strconv.Itoa(i)
		info, err := c.insp.GetTaskInfo(queue, id)
		if err != nil {
			t.Fatalf("task %s: %v", id, err)
		}
		if string(info.Payload) != "payload "+id || info.State != asynq.TaskStatePending {
			t.Errorf("task %s: payload %q, state %v; want %q, pending", id, info.Payload, info.State, "payload "+id)
		}
	}
}

// The pages a split enqueues at once go in one round trip, each as its own
// map task.
func TestTheSplitEnqueuesItsPagesTogether(t *testing.T) {
	c, queue, hook, release := newHeldClient(t)
	const n = 8 // under EnqueueConcurrency: all at once
	pages := make([]fedPage, n)
	for i := range pages {
		pages[i] = fedPage{i: i, page: []byte(strconv.Itoa(i * 10))}
	}
	run := "job:" + strings.ReplaceAll(queue, ":", "-")
	errc := make(chan error, 1)
	go func() {
		errc <- c.enqueuePages(context.Background(), run, "nonce", pages, JobOptions{Queue: queue, Codec: JSON}, packing{})
	}()
	// The first enqueuers to arrive go in the held trip, the rest wait.
	testenv.WaitFor(t, 10*time.Second, "every page to be sent or waiting", func() bool {
		trips := hook.sent()
		return len(trips) == 1 && trips[0]+c.enqueue.queued(queue) == n
	})
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Sent one by one, the pages would have taken n round trips.
	trips := hook.sent()
	sent := 0
	for _, k := range trips {
		sent += k
	}
	if len(trips) > 2 || sent != n {
		t.Fatalf("round trips (commands in each) = %v, want at most two carrying the %d pages", trips, n)
	}
	for _, p := range pages {
		info, err := c.insp.GetTaskInfo(queue, mapTaskID(run, "nonce", p.i))
		if err != nil {
			t.Fatalf("page %d: %v", p.i, err)
		}
		var got mapPayload
		if err := json.Unmarshal(info.Payload, &got); err != nil || got.Index != p.i || string(got.page()) != string(p.page) {
			t.Errorf("page %d's task: payload %s (%v), want index %d and page %s", p.i, info.Payload, err, p.i, p.page)
		}
	}
}

// noScriptOnce answers the first pipeline of EVALSHAs with NOSCRIPT for
// each command, unsent, as a Redis that lost its scripts would, and counts
// the EVALs sent alone.
type noScriptOnce struct {
	done  atomic.Bool
	evals atomic.Int32
}

func (h *noScriptOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *noScriptOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "eval" {
			h.evals.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *noScriptOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "evalsha" && h.done.CompareAndSwap(false, true) {
			for _, cmd := range cmds {
				cmd.SetErr(redis.ErrNoScript)
			}
			return redis.ErrNoScript
		}
		return next(ctx, cmds)
	}
}

// A Redis that lost its scripts (a restart, SCRIPT FLUSH) gets asynq's
// enqueue script again: the NOSCRIPT reply reaches asynq, which sends the
// script by EVAL. (Injected: a real SCRIPT FLUSH would reach the tests of
// other packages that share the server.)
func TestABatchedEnqueueRedisHasNoScriptForIsSentByEval(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	queue := testenv.Queue(t, rdb, prefix)
	hook := &noScriptOnce{}
	rdb.AddHook(hook)
	c, err := New(rdb, Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.aq.EnqueueContext(context.Background(), asynq.NewTask("t", []byte("p")), asynq.Queue(queue), asynq.TaskID("a")); err != nil {
		t.Fatalf("enqueue after NOSCRIPT: %v", err)
	}
	if !hook.done.Load() || hook.evals.Load() != 1 {
		t.Fatalf("NOSCRIPT injected: %v, EVALs sent: %d; want true, 1", hook.done.Load(), hook.evals.Load())
	}
	if info, err := c.insp.GetTaskInfo(queue, "a"); err != nil || string(info.Payload) != "p" {
		t.Fatalf("the task: %+v, %v", info, err)
	}
}

// An enqueue whose context ends while it waits for a round trip returns
// the context's error and is not sent.
func TestABatchedEnqueueWhoseContextEndsIsNotSent(t *testing.T) {
	c, queue, hook, release := newHeldClient(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = c.aq.EnqueueContext(context.Background(), asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("held"))
	}()
	testenv.WaitFor(t, 10*time.Second, "the first round trip to start", func() bool { return len(hook.sent()) == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.aq.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("cancelled"))
		errc <- err
	}()
	testenv.WaitFor(t, 10*time.Second, "the second enqueue to queue", func() bool { return c.enqueue.queued(queue) == 1 })
	cancel()
	// asynq wraps a Redis error as text, as it does for one sent alone.
	if err := <-errc; err == nil || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Errorf("cancelled enqueue: %v, want context.Canceled", err)
	}
	close(release)
	wg.Wait()
	if _, err := c.insp.GetTaskInfo(queue, "cancelled"); !errors.Is(err, asynq.ErrTaskNotFound) {
		t.Errorf("the cancelled enqueue's task: %v, want ErrTaskNotFound", err)
	}
	if _, err := c.insp.GetTaskInfo(queue, "held"); err != nil {
		t.Errorf("the held enqueue's task: %v", err)
	}
}
