package testenv

import (
	"bufio"
	"fmt"
	"net"
	"strings"
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
	r := bufio.NewReaderSize(conn, 64<<10)
	// Commands are shown from MONITOR's reply on: wait for it.
	if line, err := readLine(r); err != nil || line != "+OK" {
		_ = conn.Close()
		t.Fatalf("testenv: MONITOR: %q %v", line, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			line, err := readLine(r)
			if err != nil {
				return
			}
			each(line)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { _ = conn.Close(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// monitorLineMax is how much of a line Monitor passes on: a longer command
// (a test's large value) is cut, and monitoring goes on.
const monitorLineMax = 16 << 20

// readLine reads one line from r, without its line ending, cut to
// monitorLineMax.
func readLine(r *bufio.Reader) (string, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		if len(line) < monitorLineMax {
			line = append(line, part[:min(len(part), monitorLineMax-len(line))]...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err != nil:
			return "", err
		}
		return strings.TrimRight(string(line), "\r\n"), nil
	}
}
