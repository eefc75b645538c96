//go:build linux

package faults_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
)

// countCalls counts, until the returned stop is called, the FCALLs Redis
// runs of functions whose name begins with fn, as its MONITOR shows them:
// how a scenario shows that it drove the path it claims to. It watches on
// a connection of its own, straight to the server, so a fault between the
// workers and Redis (the proxy) does not stop it; a Redis restart does.
func (f *fleet) countCalls(fn string) (stop func() int) {
	f.t.Helper()
	conn, err := net.Dial("unix", f.redis.Socket)
	if err != nil {
		f.t.Fatalf("MONITOR: %v", err)
	}
	if _, err := fmt.Fprint(conn, "MONITOR\r\n"); err != nil {
		f.t.Fatalf("MONITOR: %v", err)
	}
	needle := `"fcall" "` + strings.ToLower(fn)
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	// Commands are shown from MONITOR's reply on: wait for it.
	if !sc.Scan() || sc.Text() != "+OK" {
		f.t.Fatalf("MONITOR: %q %v", sc.Text(), sc.Err())
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			if strings.Contains(strings.ToLower(sc.Text()), needle) {
				n.Add(1)
			}
		}
	}()
	return func() int {
		conn.Close()
		<-done
		return int(n.Load())
	}
}
