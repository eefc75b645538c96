package testenv

import (
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Proxy is a TCP proxy in front of one server, so that a test can take the
// server away from the clients that go through the proxy alone — every
// other client keeps it — and give it back, with its data, at the same
// address: a network fault between some processes and a server. Its
// methods may be called from any goroutine.
type Proxy struct {
	t       testing.TB
	network string // of the server: "tcp" or "unix"
	target  string // the server's address
	addr    string // where the proxy listens

	mu    sync.Mutex
	ln    net.Listener          // nil while cut
	conns map[net.Conn]struct{} // both ends of every proxied connection
	hole  chan struct{}         // non-nil while blackholed; closed when that ends
	held  int                   // reads and new connections the blackhole holds
	done  bool                  // the test has ended
}

// NewProxy starts a proxy on a free port of 127.0.0.1 that forwards every
// connection to the server at address on network ("tcp" or "unix", as in
// net.Dial). It stops when the test ends.
func NewProxy(t testing.TB, network, address string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	p := &Proxy{t: t, network: network, target: address, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.Cut()
		p.mu.Lock()
		p.done = true
		p.mu.Unlock()
	})
	return p
}

// RedisProxy starts a proxy in front of the Redis server of redisURL (a
// redis://, rediss:// or unix:// URL, as PrivateRedisServer's) and returns
// it with the URL of the same server and database through the proxy.
func RedisProxy(t testing.TB, redisURL string) (*Proxy, string) {
	t.Helper()
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	p := NewProxy(t, opt.Network, opt.Addr)
	u := url.URL{Scheme: "redis", Host: p.Addr(), Path: "/" + strconv.Itoa(opt.DB)}
	if opt.TLSConfig != nil {
		u.Scheme = "rediss"
	}
	switch {
	case opt.Password != "":
		u.User = url.UserPassword(opt.Username, opt.Password)
	case opt.Username != "":
		u.User = url.User(opt.Username)
	}
	return p, u.String()
}

// Addr returns the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.addr }

// Held returns how many reads (data a side sent) and new connections a
// Blackhole holds now: a test waits for one to know that what a client
// sent has reached the proxy.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Cut closes every connection and the listener: clients fail at once
// with a closed connection, then with "connection refused", until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.openHole()
}

// Blackhole keeps every connection open and accepts new ones, but forwards
// nothing, either way, until Restore: clients hang until their own
// timeouts, as when a network drops packets. What they sent meanwhile is
// delivered at Restore, as TCP retransmits it once the network heals; a
// client that gave up has closed its connection by then.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole == nil {
		p.hole = make(chan struct{})
	}
}

// Restore ends a Cut or a Blackhole: the proxy forwards again, at the same
// address. It fails the test when the address cannot be listened on again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.openHole()
	if p.ln != nil || p.done {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Errorf("testenv: proxy: listening again on %s: %v", p.addr, err)
		return
	}
	p.ln = ln
	go p.accept(ln)
}

// openHole ends a blackhole; p.mu must be held.
func (p *Proxy) openHole() {
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.accept(ln)
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // cut
		}
		go p.pipe(ln, c)
	}
}

// pass waits while the proxy is blackholed, and reports whether the
// connections of listener ln may still carry data (false once cut).
func (p *Proxy) pass(ln net.Listener) bool {
	p.mu.Lock()
	hole := p.hole
	if hole != nil {
		p.held++
	}
	p.mu.Unlock()
	if hole != nil {
		<-hole
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if hole != nil {
		p.held--
	}
	return p.ln == ln
}

// track adds conns to those Cut closes, unless the proxy was cut since ln
// accepted them; it reports whether it did.
func (p *Proxy) track(ln net.Listener, conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != ln {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies both ways between a client and the server until either side
// closes or the proxy is cut.
func (p *Proxy) pipe(ln net.Listener, c net.Conn) {
	defer c.Close()
	if !p.track(ln, c) || !p.pass(ln) { // a blackhole holds new connections too
		return
	}
	s, err := net.Dial(p.network, p.target)
	if err != nil {
		return
	}
	defer s.Close()
	if !p.track(ln, s) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.copy(ln, s, c); done <- struct{}{} }()
	go func() { p.copy(ln, c, s); done <- struct{}{} }()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// copy forwards what src sends to dst, holding it while blackholed.
func (p *Proxy) copy(ln net.Listener, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass(ln) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
