package console

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// The login limiter's rule: loginFailures wrong tokens from one client
// within loginWindow of the first block that client for loginWindow. It
// tracks at most loginClients clients.
const (
	loginFailures = 5
	loginWindow   = time.Minute
	loginClients  = 4096
)

// limiter counts wrong tokens (login form and bearer header) per client
// address, so that guessing the token costs a minute per few guesses. An
// IPv6 client is its /64, which one host usually has whole.
type limiter struct {
	now func() time.Time

	mu      sync.Mutex
	clients map[string]*strikes
}

// strikes are one client's wrong tokens since since; it is blocked until
// until once it has made loginFailures of them.
type strikes struct {
	n            int
	since, until time.Time
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, clients: map[string]*strikes{}}
}

// expired reports whether s no longer counts at now: its window and its
// block are over.
func (s *strikes) expired(now time.Time) bool {
	return !now.Before(s.since.Add(loginWindow)) && !now.Before(s.until)
}

// blocked reports whether r's client may not try a token now, and for how
// long it may not.
func (l *limiter) blocked(r *http.Request) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := clientKey(r)
	s := l.clients[k]
	switch {
	case s == nil:
		return 0, false
	case now.Before(s.until):
		return s.until.Sub(now), true
	case s.expired(now):
		delete(l.clients, k)
	}
	return 0, false
}

// fail counts a wrong token from r's client.
func (l *limiter) fail(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := clientKey(r)
	s := l.clients[k]
	if s == nil || s.expired(now) {
		if s == nil && len(l.clients) >= loginClients {
			l.makeRoom(now)
		}
		s = &strikes{since: now}
		l.clients[k] = s
	}
	s.n++
	if s.n >= loginFailures {
		s.until = now.Add(loginWindow)
	}
}

// forget clears r's client's count after a right token.
func (l *limiter) forget(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.clients, clientKey(r))
}

// makeRoom drops the clients that no longer count, or, when all still
// do, the one that started counting first: memory stays bounded however
// many addresses guess.
func (l *limiter) makeRoom(now time.Time) {
	var oldest string
	for k, s := range l.clients {
		if s.expired(now) {
			delete(l.clients, k)
			continue
		}
		if oldest == "" || s.since.Before(l.clients[oldest].since) {
			oldest = k
		}
	}
	if len(l.clients) >= loginClients {
		delete(l.clients, oldest)
	}
}

// clientKey is the address r came from: its IPv4 address, or its IPv6
// address's /64.
func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return host
	case ip.To4() != nil:
		return ip.To4().String()
	default:
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
}
