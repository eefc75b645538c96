package main_test

import (
	"context"
	"encoding/json"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// slowEcho is a job of one page that takes a second and a half, whose
// result is its arguments.
func slowEcho(name string) mapreduce.Job[string, int, int, string] {
	return mapreduce.Job[string, int, int, string]{
		Name:  name,
		Split: func(_ context.Context, _ string, emit func(int) error) error { return emit(0) },
		Map: func(ctx context.Context, _ int) (int, error) {
			select {
			case <-time.After(1500 * time.Millisecond):
				return 0, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		},
		Reduce: func(_ context.Context, args string, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (string, error) {
			for range pages {
			}
			return args, nil
		},
	}
}

// 'run --wait' polls the run's summary while it goes on and reads it
// whole once, when it has ended; 'runs' reads summaries alone: with 100 KiB
// of arguments, neither reads them on every poll or for every run.
func TestRunWaitAndRunsReadSummariesWhileARunGoesOn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, slowEcho("echo"))
	s := newScheduler(t, f)
	big := strings.Repeat("a", 100<<10)
	args, _ := json.Marshal(big)

	stop := testenv.MonitorCommands(t, f.rdb, f.prefix+":")
	out, errs, code := s.run("run", "echo", "--args", string(args), "--wait")
	if got := lines(out); code != 0 || len(got) == 0 || got[len(got)-1] != string(args) {
		t.Fatalf("run --wait: exit %d, %d bytes of stdout, stderr %q; want 0 and the result (the arguments) last", code, len(out), errs)
	}
	if out, errs, code := s.run("runs", "echo"); code != 0 || len(lines(out)) != 2 {
		t.Errorf("runs echo: exit %d, stdout %q, stderr %q; want the one run", code, out, errs)
	}
	whole, polls := 0, 0
	for _, w := range stop() {
		switch {
		case len(w) < 2:
		case strings.EqualFold(w[0], "HGETALL") && strings.Contains(w[1], "}:run:"):
			whole++
		case strings.EqualFold(w[0], "EVALSHA") && len(w) > 5 && strings.Contains(w[3], "}:run:") && w[4] == "0" && w[5] == "job":
			// StatusUpTo(ctx, id, 0): the run's summary, no value.
			polls++
		}
	}
	if whole != 1 {
		t.Errorf("the run was read whole %d times; want once, when --wait saw it end (%d polls of its summary)", whole, polls)
	}
	if polls < 2 {
		t.Errorf("--wait polled the run's summary %d times over a run of 1.5 s: the count above proves nothing", polls)
	}
}
