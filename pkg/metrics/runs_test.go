package metrics_test

import (
	"context"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// gatherRuns collects c and returns each series of the runs' families by
// its name and labels ("name{label=value,...}").
func gatherRuns(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "batchmr_run") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = value(m)
		}
	}
	return out
}

// Every worker's /metrics is scraped every few seconds: a scrape reads each
// run's state and the summaries of the runs in progress, never a run's
// arguments or result (no HGETALL of a run, no HGET or HMGET of "args" or
// "result"), however large they are.
func TestAScrapeReadsRunSummariesNotArgumentsOrResults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, "big") // its split task waits there
	job := mapreduce.Job[string, int, int, int]{
		Name:  "big",
		Split: func(_ context.Context, _ string, emit func(int) error) error { return emit(0) },
		Map:   func(context.Context, int) (int, error) { return 0, nil },
		Reduce: func(_ context.Context, _ string, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			return 0, nil
		},
		Options: mapreduce.JobOptions{AllowOverlap: true},
	}
	jobs := mapreduce.NewJobs()
	if err := jobs.Add(job); err != nil {
		t.Fatal(err)
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() { defer close(announced); _ = mr.Announce(actx, mr.NewWorkerInfo()) }()
	t.Cleanup(func() { stop(); <-announced })
	testenv.WaitFor(t, 5*time.Second, "the job in the catalogue", func() bool {
		js, _ := mr.Jobs(ctx)
		return len(js) == 1
	})
	big := strings.Repeat("a", 1<<20-2)
	active, err := job.Start(ctx, mr, big, mapreduce.StartOptions{Key: "active"}) // no worker: it stays splitting
	if err != nil {
		t.Fatal(err)
	}
	ended, err := job.Start(ctx, mr, big, mapreduce.StartOptions{Key: "ended"})
	if err != nil {
		t.Fatal(err)
	}
	if err := mr.Cancel(ctx, ended); err != nil {
		t.Fatal(err)
	}

	end := testenv.MonitorCommands(t, rdb, prefix+":")
	m := gatherRuns(t, metrics.NewFleet(mr, nil, metrics.FleetOptions{}))
	seen := end()
	for series, want := range map[string]float64{
		"batchmr_runs{batchmr_job=big,state=splitting}":              1,
		"batchmr_runs{batchmr_job=big,state=cancelled}":              1,
		"batchmr_runs{batchmr_job=big,state=succeeded}":              0,
		"batchmr_run_pages_done{batchmr_job=big,run=" + active + "}": 0,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v; the scrape: %v", series, got, ok, want, m)
		}
	}
	if _, ok := m["batchmr_run_pages_done{batchmr_job=big,run="+ended+"}"]; ok {
		t.Errorf("the ended run has a series of its progress: %v", m)
	}
	if w := testenv.ReadsWholeValue(seen); w != nil {
		t.Errorf("the scrape read a run's whole value: %q", w)
	}
	if len(seen) == 0 {
		t.Error("MONITOR saw no command: the check above proves nothing")
	}
}
