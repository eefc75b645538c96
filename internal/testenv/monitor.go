package testenv

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"testing"
)

// Monitor watches, with MONITOR on a connection of its own straight to the
// Redis server at address on network ("tcp" or "unix", as in net.Dial),
// every command the server runs from now on: it calls each with the line
// MONITOR shows for it, on one goroutine, until stop is called (or the test
// ends), and stop returns once the last call has. A fault between other
// clients and the server (a proxy) does not stop it; a restart of the
// server does. It returns once the server has taken MONITOR, so that no
// command made after it goes unseen.
func Monitor(t testing.TB, network, address string, each func(line string)) (stop func()) {
	t.Helper()
	conn, err := net.Dial(network, address)
	if err != nil {
		t.Fatalf("testenv: MONITOR: %v", err)
	}
	if _, err := fmt.Fprint(conn, "MONITOR\r\n"); err != nil {
		t.Fatalf("testenv: MONITOR: %v", err)
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	// Commands are shown from MONITOR's reply on: wait for it.
	if !sc.Scan() || sc.Text() != "+OK" {
		_ = conn.Close()
		t.Fatalf("testenv: MONITOR: %q %v", sc.Text(), sc.Err())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			each(sc.Text())
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { _ = conn.Close(); <-done }) }
	t.Cleanup(stop)
	return stop
}
