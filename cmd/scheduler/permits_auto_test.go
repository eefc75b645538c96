package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
)

func TestPermitsAutoSetsTheBoundsGetShowsThemAndSetReturnsToFixed(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host([]string{"db"}, sumJob("sum", nil))
	s := newScheduler(t, f)
	ctx := context.Background()

	if _, errs, code := s.run("permits", "set", "db", "40"); code != 0 {
		t.Fatalf("permits set db 40: exit %d, stderr %q", code, errs)
	}
	// Bad bounds: exit 2, one line naming the flag to fix; nothing changes.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max", "8"}, "--min 0: give the lowest limit"},
		{[]string{"--min", "5", "--max", "4"}, "--max 4 is below --min 5"},
		{[]string{"--min", "1", "--max", "1048577"}, "at most 1048576"},
		{[]string{"--min", "2", "--max", "8", "--fixed", "9"}, "--fixed 9 is outside [2, 8]"},
	} {
		args := append([]string{"permits", "auto", "db"}, c.args...)
		if _, errs, code := s.run(args...); code != 2 || !oneLine(errs) || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 saying %q", strings.Join(args, " "), code, errs, c.want)
		}
	}
	if out, _, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 40,") || strings.Contains(out, "mode:") {
		t.Fatalf("permits get db after refused autos: exit %d, %q; want limit 40, fixed", code, out)
	}

	out, errs, code := s.run("permits", "auto", "db", "--min", "2", "--max", "32")
	if code != 0 || !strings.HasPrefix(out, "semaphore db: limit 32 (was 40)") ||
		!strings.Contains(out, "auto mode: bounds 2..32, fixed N 32;") || !strings.Contains(out, "set by the operator") ||
		!strings.Contains(out, "no controller is built yet") {
		t.Errorf("permits auto db --min 2 --max 32 over 40: exit %d, stdout %q, stderr %q; want the limit clamped to 32, auto mode shown", code, out, errs)
	}

	// A controller's N, as SetAdaptive sets it, shows with its reason.
	sem, err := semaphore.New(f.rdb, "db", semaphore.Options{Limit: 1, Prefix: f.prefix + ":sem", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	if n, err := sem.SetAdaptive(ctx, 12, time.Hour, "queries fast"); err != nil || n != 12 {
		t.Fatalf("SetAdaptive(12) = %d, %v", n, err)
	}
	out, _, code = s.run("permits", "get", "db")
	if ls := lines(out); code != 0 || len(ls) < 2 || !strings.HasPrefix(ls[0], "semaphore db: limit 12,") ||
		!strings.HasPrefix(ls[1], "auto mode: bounds 2..32, fixed N 32; the limit last moved ") ||
		!strings.Contains(ls[1], "set by the controller, holds ") || !strings.Contains(ls[1], "the controller set 12 (queries fast)") {
		t.Errorf("permits get db under the controller's 12: exit %d, %q", code, out)
	}

	out, errs, code = s.run("permits", "auto", "db", "--min", "2", "--max", "32", "--fixed", "8", "--shadow")
	if code != 0 || !strings.HasPrefix(out, "semaphore db: limit 8 (was 12)") || !strings.Contains(out, "shadow mode: bounds 2..32, fixed N 8;") {
		t.Errorf("permits auto --fixed 8 --shadow: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if n, err := sem.SetAdaptive(ctx, 20, time.Hour, "would raise"); err != nil || n != 8 {
		t.Errorf("SetAdaptive(20) in shadow mode = %d, %v; want the limit 8 unchanged", n, err)
	}
	if out, _, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 8,") || !strings.Contains(out, "the controller would set 20 (would raise)") {
		t.Errorf("permits get db in shadow mode: exit %d, %q", code, out)
	}

	out, errs, code = s.run("permits", "set", "db", "6")
	if code != 0 || !strings.HasPrefix(out, "semaphore db: limit 6 (was 8)") || !strings.Contains(out, "shadow mode ended: the limit is fixed") {
		t.Errorf("permits set db 6 in shadow mode: exit %d, stdout %q, stderr %q; want fixed again", code, out, errs)
	}
	if out, _, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 6,") || strings.Contains(out, "mode:") {
		t.Errorf("permits get db after set: exit %d, %q; want limit 6, no mode line", code, out)
	}
	if _, err := sem.SetAdaptive(ctx, 3, time.Hour, "x"); err == nil {
		t.Error("SetAdaptive after permits set succeeded; want ErrNotAuto")
	}
}
