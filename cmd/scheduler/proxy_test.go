package main_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/batchmr/batchmr/internal/testenv"
)

// proxy stands between a command and the test Redis, so that a test can
// take Redis away from that command alone — every other client, the
// test's workers included, keeps its Redis — and give it back, with its
// data, at the same address.
type proxy struct {
	t      *testing.T
	addr   string // where the proxy listens
	target string // the Redis server's address
	url    string // the test Redis URL, through the proxy

	mu    sync.Mutex
	ln    net.Listener // nil while cut
	conns map[net.Conn]struct{}
}

func newProxy(t *testing.T) *proxy {
	t.Helper()
	u, err := url.Parse(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, addr: ln.Addr().String(), target: u.Host, conns: map[net.Conn]struct{}{}}
	u.Host = p.addr
	p.url = u.String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

// cut closes the listener and every connection: the command's calls fail
// with "connection refused" until restore.
func (p *proxy) cut() {
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
}

// restore listens again at the same address.
func (p *proxy) restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy: listening again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // cut
			}
			go p.pipe(ln, c)
		}
	}()
}

// pipe copies both ways between a client and Redis until either side
// closes or the proxy is cut.
func (p *proxy) pipe(ln net.Listener, c net.Conn) {
	r, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln != ln { // cut meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = r.Close()
		return
	}
	p.conns[c], p.conns[r] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(r, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, r); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = r.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, r)
	p.mu.Unlock()
}
