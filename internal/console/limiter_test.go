package console_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
)

// The wrong-token limit counts per client address (an IPv6 client by its
// /64) and tracks a bounded number of clients however many guess.
func TestTheLoginLimitCountsPerAddressInBoundedMemory(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := console.NewLoginLimiter(func() time.Time { return now })
	for range console.LoginFailures {
		l.Fail("192.0.2.1:40000")
		l.Fail("[2001:db8:1:2::1]:40000")
	}
	for addr, blocked := range map[string]bool{
		"192.0.2.1:50000": true, "192.0.2.2:40000": false,
		"[2001:db8:1:2::99]:1": true, "[2001:db8:1:3::1]:1": false,
	} {
		if _, got := l.Blocked(addr); got != blocked {
			t.Errorf("%s blocked: %v, want %v", addr, got, blocked)
		}
	}
	for i := range 3 * console.LoginClients {
		l.Fail(fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255))
		now = now.Add(time.Millisecond)
	}
	if n := l.Size(); n > console.LoginClients {
		t.Errorf("the limiter tracks %d clients, want at most %d", n, console.LoginClients)
	}
	now = now.Add(console.LoginWindow)
	l.Fail("192.0.2.3:1")
	if n := l.Size(); n != 1 {
		t.Errorf("a minute later the limiter tracks %d clients, want the one that just failed", n)
	}
}
