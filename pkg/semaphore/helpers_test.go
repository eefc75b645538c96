package semaphore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// newSem returns a semaphore on the test Redis under a key prefix of the
// test's own.
func newSem(t *testing.T, rdb redis.UniversalClient, prefix string, opts semaphore.Options) *semaphore.Semaphore {
	t.Helper()
	opts.Prefix = prefix
	s, err := semaphore.New(rdb, "db", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustAcquire(t *testing.T, s *semaphore.Semaphore) *semaphore.Permit {
	t.Helper()
	p, err := s.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// acquireQueued starts an Acquire on s in the background and returns once
// observer's Stats shows queued waiters in all. The channel receives the
// permit, or nil if Acquire failed (the failure is reported).
func acquireQueued(t *testing.T, s, observer *semaphore.Semaphore, queued int) <-chan *semaphore.Permit {
	t.Helper()
	return acquireNQueued(t, s, observer, 1, queued)
}

// acquireNQueued is acquireQueued for an AcquireN of weight n.
func acquireNQueued(t *testing.T, s, observer *semaphore.Semaphore, n, queued int) <-chan *semaphore.Permit {
	t.Helper()
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := s.AcquireN(context.Background(), n)
		if err != nil && !errors.Is(err, semaphore.ErrClosed) {
			// ErrClosed: the test ended (or failed) first and its cleanup
			// closed s; reporting then would be too late.
			t.Error(err)
		}
		got <- p
	}()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("%d waiters queued", queued), func() bool { return len(stats(t, observer).Waiters) == queued })
	return got
}

// heldAndQueued sets up the common scene of a hand-off: two handles on one
// semaphore, a holding a permit (p) and b queued behind it (got receives
// b's grant).
func heldAndQueued(t *testing.T, rdb redis.UniversalClient, prefix string, opts semaphore.Options) (a, b *semaphore.Semaphore, p *semaphore.Permit, got <-chan *semaphore.Permit) {
	t.Helper()
	a = newSem(t, rdb, prefix, opts)
	b = newSem(t, rdb, prefix, opts)
	p = mustAcquire(t, a)
	return a, b, p, acquireQueued(t, b, a, 1)
}

// receiveGrant returns the permit an acquireQueued call was granted,
// failing the test if none comes within d.
func receiveGrant(t *testing.T, got <-chan *semaphore.Permit, d time.Duration, what string) *semaphore.Permit {
	t.Helper()
	select {
	case q := <-got:
		if q == nil {
			t.FailNow() // acquireQueued reported the error
		}
		return q
	case <-time.After(d):
		t.Fatalf("no grant within %v: %s", d, what)
		return nil
	}
}

// cutOffPair returns two handles on one semaphore of limit 1: s, whose Redis
// connections pass through px so that the test can cut it off, with the
// given lease; and other, connected directly, with otherLease (zero: the
// default).
func cutOffPair(t *testing.T, lease, otherLease time.Duration) (s, other *semaphore.Semaphore, px *proxy) {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	px = startProxy(t, redisAddr(t))
	s = newSem(t, clientVia(t, px.addr()), prefix, semaphore.Options{Limit: 1, Lease: lease})
	other = newSem(t, rdb, prefix, semaphore.Options{Limit: 1, Lease: otherLease})
	return s, other, px
}

// deadlineMs is member's score in the sorted set key under prefix's
// semaphore "db" ("holders": its lease deadline; "alive": a waiter's
// heartbeat deadline), in Redis's milliseconds; 0 if it has none.
func deadlineMs(rdb redis.UniversalClient, prefix, key, member string) float64 {
	d, err := rdb.ZScore(context.Background(), prefix+":{db}:"+key, member).Result()
	if err != nil {
		return 0
	}
	return d
}

// leaseLeftMs is how long the lease of the permit tok has left in Redis,
// by Redis's clock, in milliseconds; 0 if Redis holds no such permit or
// does not answer. Any goroutine may call it.
func leaseLeftMs(rdb redis.UniversalClient, prefix, tok string) float64 {
	deadline := deadlineMs(rdb, prefix, "holders", tok)
	now, err := rdb.Time(context.Background()).Result()
	if deadline == 0 || err != nil {
		return 0
	}
	return deadline - float64(now.UnixMilli())
}

// redisNowMs is the time by the clock of rdb's server, in milliseconds.
func redisNowMs(t *testing.T, rdb redis.UniversalClient) float64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return float64(now.UnixMilli())
}

func stats(t *testing.T, s *semaphore.Semaphore) semaphore.Stats {
	t.Helper()
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// cmdCounter counts the commands a client sends, by name. It is a go-redis
// hook on a real client: the commands still reach the real server.
type cmdCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.n[cmd.Name()]++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *cmdCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// --- subprocesses -----------------------------------------------------------

const helperEnv = "BATCHMR_SEMTEST_HELPER"

// TestMain lets the test binary double as a helper process: with
// BATCHMR_SEMTEST_HELPER set, it runs that role instead of the tests.
func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(runHelper(role))
	}
	os.Exit(m.Run())
}

// helper is a subprocess running this test binary in a helper role. It
// speaks in lines on stdout.
type helper struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

func startHelper(t *testing.T, role, prefix string, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+role, "SEMTEST_PREFIX="+prefix,
		testenv.RedisURLVar+"="+testenv.RedisURL(t))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 1024), stdin: stdin}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// expect returns the first line starting with prefix, failing the test if
// none arrives in time or the process exits.
func (h *helper) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				t.Fatalf("helper exited before saying %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(line, prefix))
			}
		case <-timeout:
			t.Fatalf("helper did not say %q within %v", prefix, d)
		}
	}
}

func (h *helper) send(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, line); err != nil {
		t.Fatal(err)
	}
}

// --- a TCP proxy that can cut Redis off -------------------------------------

// proxy forwards TCP connections to a real Redis. cut() drops every
// connection and refuses new ones until restore(): a real network outage
// between one client and the server.
type proxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	// refused counts the connections refused while cut: a client's
	// attempts to reach Redis during the outage.
	refused atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.down.Load() {
			// cut() ran while we dialled: it did not see this
			// connection, which must not outlive it.
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			continue
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
		go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
	}
}

func (p *proxy) cut() {
	p.down.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *proxy) restore() { p.down.Store(false) }
