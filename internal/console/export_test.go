package console

import (
	"net/http"
	"time"
)

// Routes lists the patterns c serves, in the order they were registered.
func (c *Console) Routes() []string {
	var ps []string
	for _, r := range c.table {
		ps = append(ps, r.pattern)
	}
	return ps
}

const (
	LoginFailures = loginFailures
	LoginWindow   = loginWindow
	LoginClients  = loginClients
)

// LoginLimiter is the console's wrong-token limiter, driven by client
// address.
type LoginLimiter struct{ l *limiter }

func NewLoginLimiter(now func() time.Time) LoginLimiter { return LoginLimiter{newLimiter(now)} }

func from(addr string) *http.Request { return &http.Request{RemoteAddr: addr} }

func (x LoginLimiter) Fail(addr string) { x.l.fail(from(addr)) }

func (x LoginLimiter) Forget(addr string) { x.l.forget(from(addr)) }

func (x LoginLimiter) Blocked(addr string) (time.Duration, bool) { return x.l.blocked(from(addr)) }

// Size is how many clients the limiter tracks.
func (x LoginLimiter) Size() int {
	x.l.mu.Lock()
	defer x.l.mu.Unlock()
	return len(x.l.clients)
}

// ShadowPath is the chart's line of the shadow N (its SVG path data) for
// samples a second apart with these shadow Ns (0: outside shadow mode).
func ShadowPath(ns ...int) string {
	at := time.Unix(0, 0)
	var s []sample
	for _, n := range ns {
		at = at.Add(time.Second)
		s = append(s, sample{at: at, limit: 4, shadow: n})
	}
	return drawChart(s, time.Duration(len(ns))*time.Second).Shadow
}
