package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
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
		{[]string{"--min", "2", "--max", "8", "--window", "10ms"}, "--window 10ms: give one from 100ms to 10m0s"},
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
		!strings.Contains(out, "auto mode: bounds 2..32, fixed N 32;") || !strings.Contains(out, "set by the operator") {
		t.Errorf("permits auto db --min 2 --max 32 over 40: exit %d, stdout %q, stderr %q; want the limit clamped to 32, auto mode shown", code, out, errs)
	}

	// A controller's N shows with its reason and its last window.
	sem, err := semaphore.New(f.rdb, "db", semaphore.Options{Limit: 1, Prefix: f.prefix + ":sem", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	testenv.Loop(t, 4, func(ctx context.Context) {
		_ = sem.Do(ctx, func(context.Context) error { time.Sleep(5 * time.Millisecond); return nil })
	})
	ctlCtx, stopCtl := context.WithCancel(ctx)
	t.Cleanup(stopCtl)
	window := 100 * time.Millisecond
	go func() { _ = sem.RunController(ctlCtx, semaphore.ControllerOptions{Window: window, Logger: quiet}) }()
	var out2 string
	testenv.WaitFor(t, 20*time.Second, "permits get to show the controller's N", func() bool {
		out2, _, code = s.run("permits", "get", "db")
		ls := lines(out2)
		return code == 0 && len(ls) >= 3 && strings.HasPrefix(ls[1], "auto mode: bounds 2..32, fixed N 32; the limit last moved ") &&
			strings.Contains(ls[1], "set by the controller, holds ") && strings.Contains(ls[1], "the controller set ") &&
			strings.HasPrefix(ls[2], "its last window (")
	})

	out, errs, code = s.run("permits", "auto", "db", "--min", "2", "--max", "32", "--fixed", "8", "--shadow", "--window", "200ms")
	if code != 0 || !strings.HasPrefix(out, "semaphore db: limit 8 (was ") || !strings.Contains(out, "shadow mode: bounds 2..32, fixed N 8, window 200ms;") {
		t.Errorf("permits auto --fixed 8 --shadow: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	testenv.WaitFor(t, 20*time.Second, "permits get to show what the controller would set, the limit staying 8", func() bool {
		out2, _, code = s.run("permits", "get", "db")
		if !strings.HasPrefix(out2, "semaphore db: limit 8,") {
			t.Fatalf("permits get db in shadow mode: %q; want the limit 8 unchanged", out2)
		}
		return code == 0 && strings.Contains(out2, "the controller would set ")
	})

	out, errs, code = s.run("permits", "set", "db", "6")
	if code != 0 || !strings.HasPrefix(out, "semaphore db: limit 6 (was 8)") || !strings.Contains(out, "shadow mode ended: the limit is fixed") {
		t.Errorf("permits set db 6 in shadow mode: exit %d, stdout %q, stderr %q; want fixed again", code, out, errs)
	}
	time.Sleep(5 * window) // the controller runs on, and must not act
	if out, _, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 6,") || strings.Contains(out, "mode:") {
		t.Errorf("permits get db after set and five windows of a controller: exit %d, %q; want limit 6, no mode line", code, out)
	}
}
