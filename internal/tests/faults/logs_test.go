//go:build linux

package faults_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// Before, a worker logged a warning per failed attempt through an outage:
// a 10 s database outage ~300 a worker, one per page and retry, and a
// Redis outage of 10 s ~15, asynq's repeating every few seconds. Now a
// line that says Redis or the database is away comes once per component
// that meets it, or once per permit (pgsource, for each query the outage
// broke; the semaphore, for each permit it could not give back).

// A database outage of 10 s mid-run: each worker says once that the
// database is unreachable (its first error, at warn) and once that it is
// over (info, how long it lasted and how many attempts failed for it), and
// logs each failed attempt at debug only, while the pages back off and
// the run ends exact.
func TestADatabaseOutageLogsItsStartAndEndOncePerWorkerNotEachRetry(t *testing.T) {
	mostlyWaits(t)
	f := newFleet(t, fleetConfig{JSONLogs: true})
	f.through(databaseFault, func() {
		f.pg.Stop(testenv.StopImmediate)
		time.Sleep(10 * time.Second)
		f.pg.Start()
	})
	f.checkOutageLogged(1+permits, "mapreduce: database unreachable")
}

// Redis killed for 10 s mid-run: asynq's errors, which it repeats every
// few seconds while Redis is away, are one warning per worker when Redis
// goes and one line when the worker's client sees it answer again; so
// are the semaphore's retries of acquires, releases and refreshes.
func TestARedisOutageLogsItsStartAndEndOncePerWorkerNotEachRetry(t *testing.T) {
	mostlyWaits(t)
	f := newFleet(t, fleetConfig{JSONLogs: true})
	f.through(redisFault, func() {
		f.redis.Kill()
		time.Sleep(10 * time.Second)
		f.redis.Start()
	})
	f.checkOutageLogged(0, "worker: asynq: Redis unreachable", "mapreduce: Redis unreachable", "semaphore: Redis unreachable")
}

// checkOutageLogged fails the test unless each worker logged the outage
// whose lines begin with must once at warn, and its end once at info with
// how long it lasted and how many attempts failed for it, and those of
// may (components that meet the outage only if they work in it) at most
// once, each with its end; and
// no line at warn or above more often than once per permit, nor, if most
// is not 0, more than most lines at warn and above in all.
func (f *fleet) checkOutageLogged(most int, must string, may ...string) {
	f.t.Helper()
	for i, w := range f.workers {
		var loud []map[string]any
		repeats := map[string]int{}
		recs := w.out.Records(f.t)
		for _, r := range recs {
			if r["level"] == "WARN" || r["level"] == "ERROR" {
				loud = append(loud, r)
				repeats[r["msg"].(string)]++
			}
		}
		for j, prefix := range append([]string{must}, may...) {
			var starts, ends []map[string]any
			for _, r := range recs {
				msg, _ := r["msg"].(string)
				switch {
				case strings.HasPrefix(msg, prefix) && r["level"] == "WARN":
					starts = append(starts, r)
				case strings.HasPrefix(msg, prefix) && strings.HasSuffix(msg, ": over") && r["level"] == "INFO":
					ends = append(ends, r)
				}
			}
			f.t.Logf("worker %d: %q: %d starts; ends %v", i, prefix, len(starts), ends)
			if j > 0 && len(starts) == 0 && len(ends) == 0 {
				continue // did not meet it
			}
			if len(starts) != 1 || starts[0]["error"] == nil {
				f.t.Errorf("worker %d: want one warning that %q started, with its first error; got %d: %v", i, prefix, len(starts), starts)
			}
			if len(ends) != 1 || ends[0]["lasted"] == nil || !(ends[0]["failures"].(float64) >= 1) {
				f.t.Errorf("worker %d: want one line that %q is over, with how long it lasted and the attempts that failed; got %d: %v", i, prefix, len(ends), ends)
			}
		}
		var b strings.Builder
		for _, r := range loud {
			fmt.Fprintf(&b, "%s %s\n", r["level"], r["msg"])
		}
		f.t.Logf("worker %d: %d lines at warn and above", i, len(loud))
		for msg, n := range repeats {
			if n > permits {
				f.t.Errorf("worker %d: %q logged %d times at warn and above through the outage, more than once per permit (%d):\n%s", i, msg, n, permits, b.String())
			}
		}
		if most > 0 && len(loud) > most {
			f.t.Errorf("worker %d: %d lines at warn and above through the outage, want at most %d:\n%s", i, len(loud), most, b.String())
		}
	}
}
