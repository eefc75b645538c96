package console_test

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// echoJob is a job of one page whose result is its arguments.
func echoJob(name string) mapreduce.Job[string, int, int, string] {
	return mapreduce.Job[string, int, int, string]{
		Name:  name,
		Split: func(_ context.Context, _ string, emit func(int) error) error { return emit(0) },
		Map:   func(context.Context, int) (int, error) { return 0, nil },
		Reduce: func(_ context.Context, args string, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (string, error) {
			for range pages {
			}
			return args, nil
		},
	}
}

// The runs pages and a run's live fragment are fetched every second of
// every open tab: they read summaries from Redis (no HGETALL of a run, no
// HGET or HMGET of "args" or "result") and send a few KiB, whatever a run's
// arguments and result weigh. The fragment says how large they are
// instead.
func TestRunsPagesAndTheLiveFragmentReadNoLargeArgumentsOrResults(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	job := echoJob("echo")
	f.host(1, nil, job)
	id, err := job.Start(context.Background(), f.mr, strings.Repeat("a", 1<<20-2), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := f.mr.Wait(context.Background(), id); err != nil || st.State != mapreduce.StateSucceeded || st.ResultBytes != 1<<20 {
		t.Fatalf("the run: %+v, %v; want succeeded with a 1 MiB result", st, err)
	}

	stop := testenv.MonitorCommands(t, f.rdb, f.prefix+":")
	live := "/run/live?" + url.Values{"id": {id}}.Encode()
	for _, path := range []string{"/runs", "/runs/live", "/runs?state=active", "/runs/live?state=succeeded", live} {
		start := time.Now()
		code, body := f.get(path)
		if code != http.StatusOK || len(body) > 64<<10 {
			t.Errorf("GET %s: %d, %d bytes; want 200 and a few KiB (took %v)", path, code, len(body), time.Since(start))
		}
		if path == live && (!strings.Contains(body, "1024.0 KiB: too large to refresh every second; reload the page") || !strings.Contains(body, `id="result"`)) {
			t.Errorf("GET %s does not say how large the arguments and result are:\n%s", path, body)
		}
	}
	seen := stop()
	if w := testenv.ReadsWholeValue(seen); w != nil {
		t.Errorf("a listing or the live fragment read a whole value: %q", w)
	}
	if len(seen) == 0 {
		t.Error("MONITOR saw no command: the check above proves nothing")
	}

	// The run's page itself reads the run whole.
	if code, body := f.get(runPath(id)); code != http.StatusOK || len(body) < 1<<20 {
		t.Errorf("GET %s: %d, %d bytes; want the run whole", runPath(id), code, len(body))
	}
}
