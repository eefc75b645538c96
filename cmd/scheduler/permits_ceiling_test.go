package main_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/pkg/semaphore"
)

func TestPermitsSetRefusesALimitAboveTheCeilingOrPastIntsRange(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host([]string{"db"}, sumJob("sum", nil))
	s := newScheduler(t, f)

	if _, errs, code := s.run("permits", "set", "db", "7"); code != 0 {
		t.Fatalf("permits set db 7: exit %d, stderr %q", code, errs)
	}
	ceiling := strconv.Itoa(semaphore.MaxLimit)
	for _, n := range []string{strconv.Itoa(semaphore.MaxLimit + 1), "9223372036854775807", "9223372036854775808", "99999999999999999999999"} {
		for _, args := range [][]string{{"permits", "set", "db", n}, {"permits", "set", "db", n, "--new"}} {
			_, errs, code := s.run(args...)
			if code != 2 || !oneLine(errs) || !strings.Contains(errs, "at most "+ceiling) {
				t.Errorf("%s: exit %d, stderr %q; want exit 2 naming the ceiling %s", strings.Join(args, " "), code, errs, ceiling)
			}
		}
	}
	if out, _, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 7,") {
		t.Errorf("permits get db after the refusals: exit %d, %q; want limit 7 unchanged", code, out)
	}
	if out, errs, code := s.run("permits", "set", "db", ceiling); code != 0 || !strings.HasPrefix(out, "semaphore db: limit "+ceiling+" (was 7)") {
		t.Errorf("permits set db %s: exit %d, stdout %q, stderr %q; want the ceiling accepted", ceiling, code, out, errs)
	}
}
