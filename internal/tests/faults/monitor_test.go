//go:build linux

package faults_test

import (
	"strings"
	"sync/atomic"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// countCalls counts, until the returned stop is called, the FCALLs Redis
// runs of functions whose name begins with fn, as its MONITOR shows them:
// how a scenario shows that it drove the path it claims to. It watches on
// a connection of its own, straight to the server, so a fault between the
// workers and Redis (the proxy) does not stop it; a Redis restart does.
func (f *fleet) countCalls(fn string) (stop func() int) {
	f.t.Helper()
	needle := `"fcall" "` + strings.ToLower(fn)
	var n atomic.Int64
	end := testenv.Monitor(f.t, "unix", f.redis.Socket, func(line string) {
		if strings.Contains(strings.ToLower(line), needle) {
			n.Add(1)
		}
	})
	return func() int {
		end()
		return int(n.Load())
	}
}
