package semaphore_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// argRetry is the acquire script's retry flag (ARGV[9]) in a call's
// arguments.
const argRetry = 3 + numKeys + 8

// lateCall is a hook that holds back the first acquire call of a waiter
// (a first attempt: its retry flag is "0"), failing it as a timed-out read
// would, as if the request had left but its reply had not come back, and
// keeps its arguments so that the test can make it land later.
type lateCall struct {
	mu       sync.Mutex
	args     []any         // the held call's, once held
	token    string        // its token
	gaveBack chan struct{} // closed once a release of token has returned
}

func (h *lateCall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd, semaphore.AcquireScript) && arg(cmd, argWaitFlag) == "1" && arg(cmd, argRetry) == "0" {
			h.mu.Lock()
			first := h.args == nil
			if first {
				h.args, h.token = cmd.Args(), arg(cmd, argToken)
			}
			h.mu.Unlock()
			if first {
				err := errors.New("read tcp 127.0.0.1:6379: i/o timeout (injected: the request is on its way)")
				cmd.SetErr(err)
				return err
			}
		}
		err := next(ctx, cmd)
		if err == nil && (isScriptOrItsSource(cmd, semaphore.ReleaseScript) || isScriptOrItsSource(cmd, semaphore.CarryScript)) {
			h.mu.Lock()
			if h.token != "" && arg(cmd, argToken) == h.token {
				select {
				case <-h.gaveBack:
				default:
					close(h.gaveBack)
				}
			}
			h.mu.Unlock()
		}
		return err
	}
}

func (h *lateCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isScriptOrItsSource is isScript, or the EVAL of the script's source that
// follows an EVALSHA the server had not cached.
func isScriptOrItsSource(cmd redis.Cmder, id semaphore.ScriptID) bool {
	if cmd.Name() != "eval" || len(cmd.Args()) < 2 {
		return isScript(cmd, id)
	}
	src, ok := cmd.Args()[1].(string)
	sum := sha1.Sum([]byte(src))
	return ok && hex.EncodeToString(sum[:]) == id.Hash
}

// land makes the held call reach Redis now, over rdb, once its token was
// given back.
func (h *lateCall) land(t *testing.T, rdb *redis.Client) any {
	t.Helper()
	select {
	case <-h.gaveBack:
	case <-time.After(5 * time.Second):
		t.Fatal("the held call's token was not given back")
	}
	return landCall(t, rdb, h.held(t))
}

// held returns the held call's arguments.
func (h *lateCall) held(t *testing.T) []any {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.args == nil {
		t.Fatal("no acquire call was held")
	}
	return h.args
}

// landCall runs a script call with args over rdb and returns its reply.
func landCall(t *testing.T, rdb *redis.Client, args []any) any {
	t.Helper()
	res, err := rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("landing an acquire call: %v", err)
	}
	return res
}

// lateScene is a handle a whose first acquire call is held back, on a
// semaphore of one permit, and a handle of its own on the same semaphore.
func lateScene(t *testing.T) (a, other *semaphore.Semaphore, h *lateCall, rdb *redis.Client) {
	t.Helper()
	h = &lateCall{gaveBack: make(chan struct{})}
	rdb, prefix := testenv.Redis(t)
	hooked := redis.NewClient(rdb.Options())
	hooked.AddHook(h)
	t.Cleanup(func() { _ = hooked.Close() })
	// A lease far longer than the test: what gives a stray permit back here
	// is not its lease running out.
	a = newSem(t, hooked, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	other = newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	return a, other, h, rdb
}

// freeWithin fails t unless the semaphore has no holder and no waiter
// within d.
func freeWithin(t *testing.T, other *semaphore.Semaphore, d time.Duration, what string) {
	t.Helper()
	var st semaphore.Stats
	if !testenv.Eventually(d, func() bool { st = stats(t, other); return st.Held == 0 && len(st.Waiters) == 0 }) {
		t.Fatalf("%s: %v later the semaphore is still taken, by nobody that uses it: %+v", what, d, st)
	}
}

// A waiter's first acquire call times out on its way, so it asks again
// as a retry: Redis does not know the token, and the waiter queues under a
// new one and gives the old one back, which finds nothing. Then the first
// call lands. It must take nothing — neither a place in the queue, which a
// release would later grant to nobody, nor the free permit — where it used
// to leave a permit taken, and refreshed by nobody, for a lease and more.
func TestAnAcquireCallThatLandsAfterItsTokenWasGivenUpTakesNothing(t *testing.T) {
	for _, free := range []bool{false, true} {
		name := "behind a holder"
		if free {
			name = "with the permit free"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, other, h, rdb := lateScene(t)
			ctx := context.Background()
			var p *semaphore.Permit
			if free {
				p = mustAcquire(t, a) // the retry, under a new token
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				held := mustAcquire(t, other)
				got := acquireQueued(t, a, other, 1) // the retry, under a new token
				defer func() {
					if err := held.Release(ctx); err != nil {
						t.Error(err)
					}
					_ = receiveGrant(t, got, 5*time.Second, "a's place").Release(ctx)
				}()
			}
			before := stats(t, other)
			if res, ok := h.land(t, rdb).([]any); !ok || len(res) != 3 || res[0] != int64(3) {
				t.Fatalf("the late call got %v, want {3 0 1}: its token is given up, it takes nothing", res)
			}
			after := stats(t, other)
			if after.Held != before.Held || len(after.Waiters) != len(before.Waiters) {
				t.Fatalf("the late call changed the semaphore: before %+v, after %+v", before, after)
			}
		})
	}
}

// A first acquire call that reaches Redis twice (a client that resends a
// command whose reply is late; the semaphore's own are sent once) queues
// its token once: the second copy takes nothing.
func TestAFirstAcquireCallThatLandsTwiceQueuesOnce(t *testing.T) {
	t.Parallel()
	a, other, h, rdb := lateScene(t)
	ctx := context.Background()
	held := mustAcquire(t, other)
	defer func() { _ = held.Release(ctx) }()
	_ = acquireQueued(t, a, other, 1) // its first call is held back
	args := append([]any(nil), h.held(t)...)
	args[argToken] = "copies-1-x:1:1"
	if res, ok := landCall(t, rdb, args).([]any); !ok || len(res) != 3 || res[0] != int64(0) {
		t.Fatalf("the first copy got %v, want it queued", res)
	}
	first := stats(t, other)
	if res, ok := landCall(t, rdb, args).([]any); !ok || len(res) != 3 || res[0] != int64(3) {
		t.Fatalf("the second copy got %v, want {3 0 1}: it takes nothing", res)
	}
	if again := stats(t, other); again.Held != first.Held || !slices.Equal(waiterIDsOf(again), waiterIDsOf(first)) {
		t.Fatalf("the second copy changed the semaphore: after the first %+v, after the second %+v", first, again)
	}
}

// waiterIDsOf lists st's waiters in queue order.
func waiterIDsOf(st semaphore.Stats) []string {
	var ids []string
	for _, w := range st.Waiters {
		ids = append(ids, w.ID)
	}
	return ids
}

// The semaphore's first acquire call is sent once: go-redis resends a
// command whose reply does not come within its read timeout (MaxRetries,
// 3 by default), on another connection, and each copy may take a place or
// a permit; a copy that lands after its token's whole life (granted,
// released) would take one that nobody uses.
func TestAFirstAcquireCallIsSentOnceWhenItsReplyIsLost(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout = 200 * time.Millisecond // go-redis resends after this, unless told not to
	var mu sync.Mutex
	var conns []*muteConn
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mc := &muteConn{Conn: c}
		mu.Lock()
		conns = append(conns, mc)
		mu.Unlock()
		return mc, nil
	}
	lossy := redis.NewClient(opt)
	t.Cleanup(func() { _ = lossy.Close() })
	a := newSem(t, lossy, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	other := newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: time.Minute})
	ctx := context.Background()
	if err := lossy.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, other)
	acquires := countAcquires(t, rdb, prefix)
	// Every connection a has now loses its replies; new ones do not.
	mu.Lock()
	for _, c := range conns {
		c.mute()
	}
	mu.Unlock()
	got := acquireQueued(t, a, other, 1)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p := receiveGrant(t, got, 10*time.Second, "a, once the holder released")
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	freeWithin(t, other, 2*time.Second, "a released its only permit")
	firsts, retries := acquires()
	if retries == 0 {
		t.Errorf("Redis ran no retry of a's acquire call: its first call's reply was not lost, and the test tested nothing")
	}
	if firsts != 1 {
		t.Errorf("Redis ran %d first acquire calls of a's one Acquire, want 1 (more: go-redis resent it)", firsts)
	}
}

// muteConn loses what the server sends once muted, as a network that drops
// the replies: a read waits out its deadline and times out.
type muteConn struct {
	net.Conn
	mu       sync.Mutex
	muted    bool
	deadline time.Time
}

func (c *muteConn) mute() {
	c.mu.Lock()
	c.muted = true
	c.mu.Unlock()
}

func (c *muteConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *muteConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *muteConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	muted, deadline := c.muted, c.deadline
	c.mu.Unlock()
	if !muted {
		return c.Conn.Read(b)
	}
	if deadline.IsZero() { // a blocking read: the dispatcher's
		if err := c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return 0, err
		}
	}
	// What arrives is lost; the read ends when the socket's does, at its
	// deadline.
	for {
		if _, err := c.Conn.Read(b); err != nil {
			return 0, err
		}
	}
}

// countAcquires counts, with MONITOR, the acquire calls that ask to wait on
// semaphores under prefix that the server of rdb runs until stop is
// called: first attempts (retry flag "0") and retries.
func countAcquires(t *testing.T, rdb *redis.Client, prefix string) (stop func() (firsts, retries int)) {
	t.Helper()
	var nFirsts, nRetries atomic.Int64
	end := testenv.Monitor(t, rdb.Options().Network, rdb.Options().Addr, func(l string) {
		isAcquire := strings.Contains(l, `"`+semaphore.AcquireScript.Function+`"`) || strings.Contains(l, `"`+semaphore.AcquireScript.Hash+`"`) ||
			strings.Contains(l, `] "eval" "`) && strings.Contains(l, "queue_short(ARGV)") // EVALSHA's fallback: the acquire script's source
		if !isAcquire || !strings.Contains(l, `"`+prefix+`:`) {
			return
		}
		switch { // ARGV[8] wait, ARGV[9] the retry flag
		case strings.HasSuffix(l, `"1" "0"`):
			nFirsts.Add(1)
		case strings.HasSuffix(l, `"1" "1"`):
			nRetries.Add(1)
		}
	})
	return func() (int, int) {
		end()
		return int(nFirsts.Load()), int(nRetries.Load())
	}
}
