package pgsource_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgProxy forwards connections to the test Postgres until told to refuse
// new ones (nothing listens) or to swallow them (a cut network: accepted,
// never answered). Connections already forwarded go on either way, and
// with them the queries the test wants left running.
type pgProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	swallow  bool
	conns    []net.Conn
	// dropCancels is how many cancel requests still to swallow: each is
	// read and its connection closed, as Postgres does with a cancel that
	// reaches a backend still reading its query. cancels counts every
	// cancel request seen, dropped or forwarded.
	dropCancels int
	cancels     int
	// swallowed counts the swallowed connections that opened with
	// anything but a cancel request: a connection's attempt to start.
	swallowed int
}

func startPgProxy(t *testing.T) *pgProxy {
	t.Helper()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, upstream: u.Host}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			swallow := p.swallow
			p.mu.Unlock()
			if swallow {
				go p.swallowStart(c)
				continue
			}
			go p.forward(c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

// close stops the proxy and drops every connection through it.
func (p *pgProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// swallowStart reads a swallowed connection's first message head and
// counts it unless it is a cancel request; it never answers.
func (p *pgProxy) swallowStart(c net.Conn) {
	var head [8]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return
	}
	if binary.BigEndian.Uint32(head[:4]) != 16 || binary.BigEndian.Uint32(head[4:]) != 80877102 {
		p.mu.Lock()
		p.swallowed++
		p.mu.Unlock()
	}
}

func (p *pgProxy) forward(c net.Conn) {
	// A connection's first 8 bytes are its first message's length and
	// code; a cancel request is 16 bytes long with code 80877102.
	var head [8]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		_ = c.Close()
		return
	}
	if binary.BigEndian.Uint32(head[:4]) == 16 && binary.BigEndian.Uint32(head[4:]) == 80877102 {
		p.mu.Lock()
		p.cancels++
		drop := p.dropCancels > 0
		if drop {
			p.dropCancels--
		}
		p.mu.Unlock()
		if drop {
			_, _ = io.Copy(io.Discard, io.LimitReader(c, 8))
			_ = c.Close()
			return
		}
	}
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	if _, err := up.Write(head[:]); err != nil {
		_ = c.Close()
		return
	}
	go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
}

// url is the test database's URL through the proxy.
func (p *pgProxy) url(t *testing.T) string {
	u, _ := url.Parse(testenv.DatabaseURL(t))
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *pgProxy) refuse() { _ = p.ln.Close() }

func (p *pgProxy) cut() {
	p.mu.Lock()
	p.swallow = true
	p.mu.Unlock()
}

// proxiedQuery starts a long query through p under a fresh semaphore of
// lease, on a pool of pgx's defaults (which abandons a cancelled query's
// connection, so that Do must check on it through p), and returns once
// Postgres runs it. Its query is ended directly when the test ends. The
// query's context derives from base.
func proxiedQuery(t *testing.T, base context.Context, p *pgProxy, lease time.Duration) (sem *semaphore.Semaphore, cancel func(), done <-chan error) {
	t.Helper()
	name := appName(t)
	cfg, err := pgxpool.ParseConfig(p.url(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(p.close) // first: pgx would wait on a swallowed connection
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
		if err != nil {
			t.Log(err)
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", name)
	})
	rdb, prefix := testenv.Redis(t)
	sem, err = semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Lease: lease, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	ctx, cancel := context.WithCancel(base)
	errc := make(chan error, 1)
	go func() { errc <- pgsource.Exec(ctx, pool, sem, longQuery) }()
	a := &activity{app: name}
	a.waitActive(t, 1, "the query through the proxy")
	return sem, cancel, errc
}

// When the server cannot be asked whether a cancelled query still runs
// because the network to it is cut, the permit stays taken — the query may
// still run — for one lease, the time after which the fleet takes back the
// permit of a holder it cannot hear from; then it goes back.
func TestAPermitWhoseQueryCannotBeCheckedOnIsHeldForOneLease(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	p := startPgProxy(t)
	sem, cancel, done := proxiedQuery(t, context.Background(), p, lease)
	p.cut()
	cancel()
	cancelled := time.Now()
	testenv.WaitFor(t, lease/2, "Exec to try to check on its query through the cut network", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.swallowed > 0
	})
	if st, err := sem.Stats(context.Background()); err != nil || st.Held != 1 {
		t.Errorf("while Exec cannot check on its cancelled query: %+v, %v; want the permit still held", st, err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Exec: %v, want context.Canceled", err)
		}
		if waited := time.Since(cancelled); waited < lease {
			t.Errorf("the permit went back %v after the cancel, before one lease (%v)", waited, lease)
		}
	case <-time.After(lease + 5*time.Second):
		t.Fatal("the permit of an unchecked query was held past its lease")
	}
	if st, err := sem.Stats(context.Background()); err != nil || st.Held != 0 {
		t.Errorf("after Exec returned: %+v, %v; want no permit held", st, err)
	}
}

// When nothing listens at the server's address any more, a query cannot
// still run there: the permit goes back at once, without waiting a lease.
func TestAPermitGoesBackAtOnceWhenTheServerRefusesConnections(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	p := startPgProxy(t)
	sem, cancel, done := proxiedQuery(t, context.Background(), p, lease)
	p.refuse()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Exec: %v, want context.Canceled", err)
		}
	case <-time.After(lease / 2):
		t.Fatal("the permit was held although the server refuses connections")
	}
	if st, err := sem.Stats(context.Background()); err != nil || st.Held != 0 {
		t.Errorf("after Exec returned: %+v, %v; want no permit held", st, err)
	}
}
