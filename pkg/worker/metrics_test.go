package worker_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/mrotel"
	"github.com/batchmr/batchmr/pkg/worker"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// startMetricsWorker runs a worker in this process, serving its metrics on
// a free port, and returns the endpoints' base URL once /healthz answers.
func startMetricsWorker(t *testing.T, cfg worker.Config, jobs ...mapreduce.AnyJob) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(ctx, worker.WithMetricsListener(cfg, ln), jobs...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("worker.Run: %v", err)
		}
	})
	base := "http://" + ln.Addr().String()
	testenv.WaitFor(t, 15*time.Second, "the worker to serve /healthz", func() bool {
		select {
		case err := <-stopped:
			stopped <- nil // for the cleanup, which waits on it
			t.Fatalf("worker.Run returned before serving /healthz: %v", err)
		default:
		}
		code, _ := get(t, base+"/healthz")
		return code == http.StatusOK
	})
	return base
}

// get returns the status code and body of url; code 0 if the request failed.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape is one scrape of /metrics.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, base string) scrape {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the series of name whose labels include
// labels ("k=v" pairs): a gauge's or counter's value, a histogram's count.
func (s scrape) value(name string, labels ...string) (float64, bool) {
	f, ok := s[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func (s scrape) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.value(name, labels...)
	if !ok {
		t.Fatalf("/metrics has no series %s%v", name, labels)
	}
	return v
}

// A worker's /metrics shows a run as it goes and once it ended: the
// active run's progress, the fleet's "db" semaphore with its configured
// limit, and this process's pages, permits and run outcome, all with the
// run's real numbers.
func TestMetricsShowARunsProgressPagesAndPermitsWithTheirRealValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, ordersreport.Name)
	if err := ordersreport.Seed(ctx, pool, 2_000); err != nil {
		t.Fatal(err)
	}
	const limit = 3
	// A tracer beside the metrics: Config.Observer sees the same steps.
	spans := tracetest.NewSpanRecorder()
	tracer := mrotel.New(mrotel.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	base := startMetricsWorker(t, worker.Config{RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURLIn(t, schema),
		Prefix: prefix, Concurrency: 6, Permits: map[string]int{worker.DBSemaphore: limit}, PollInterval: 20 * time.Millisecond,
		Observer: tracer}, ordersreport.Job)
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	// The job is in the catalogue once the worker announced it.
	testenv.WaitFor(t, 10*time.Second, "the worker to announce its job", func() bool {
		v, ok := scrapeMetrics(t, base).value("batchmr_job_workers", "batchmr_job="+ordersreport.Name)
		return ok && v == 1
	})
	// 40 pages of 100 ms under 3 permits: active for over a second, so a
	// slow scrape on a loaded machine still finds it running.
	run, err := ordersreport.Job.Start(ctx, mr, ordersreport.Args{PageSize: 50, SlowMS: 100}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// During the run: its progress, labelled by job and run, and the
	// semaphore, fleet-wide.
	var during scrape
	testenv.WaitFor(t, 10*time.Second, "a scrape showing the run part-done", func() bool {
		during = scrapeMetrics(t, base)
		done, ok := during.value("batchmr_run_pages_done", "run="+run)
		return ok && done > 0
	})
	if got := during.must(t, "batchmr_semaphore_limit", "semaphore=db"); got != limit {
		t.Errorf("batchmr_semaphore_limit = %v, want the configured %d", got, limit)
	}
	if held := during.must(t, "batchmr_semaphore_held", "semaphore=db"); held < 0 || held > limit {
		t.Errorf("batchmr_semaphore_held = %v during the run, want 0..%d", held, limit)
	}
	if w := during.must(t, "batchmr_semaphore_waiters", "semaphore=db"); w < 0 || w > 6 {
		t.Errorf("batchmr_semaphore_waiters = %v, want 0..6 (the worker's concurrency)", w)
	}
	if during.must(t, "batchmr_fleet_up") != 1 {
		t.Error("batchmr_fleet_up is not 1 while Redis answers")
	}

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := mr.Wait(wctx, run)
	if err != nil || st.State != mapreduce.StateSucceeded {
		t.Fatalf("run %s: %v, %+v", run, err, st)
	}
	// The outcome is counted by the process that recorded it, just before
	// or after Wait saw it.
	var after scrape
	testenv.WaitFor(t, 10*time.Second, "the run's end in /metrics", func() bool {
		after = scrapeMetrics(t, base)
		v, _ := after.value("batchmr_runs_ended_total", "batchmr_job="+ordersreport.Name, "state=succeeded")
		return v == 1
	})
	job := "batchmr_job=" + ordersreport.Name
	if got := after.must(t, "batchmr_pages_done_total", job); got != float64(st.Total) {
		t.Errorf("batchmr_pages_done_total = %v, want the run's %d pages", got, st.Total)
	}
	if got := after.must(t, "batchmr_page_duration_seconds", job, "outcome=succeeded"); got != float64(st.Total) {
		t.Errorf("batchmr_page_duration_seconds has %v observations, want %d", got, st.Total)
	}
	if got := after.must(t, "batchmr_run_duration_seconds", job, "state=succeeded"); got != 1 {
		t.Errorf("batchmr_run_duration_seconds has %v observations, want 1", got)
	}
	maps := 0
	for _, s := range spans.Ended() {
		if s.Name() == "batchmr.map" && s.Status().Code != codes.Error { // failed attempts are retried
			maps++
		}
	}
	if maps != st.Total {
		t.Errorf("Config.Observer saw %d map steps succeed (spans), want the run's %d pages", maps, st.Total)
	}
	if got := after.must(t, "batchmr_runs", job, "state=succeeded"); got != 1 {
		t.Errorf("batchmr_runs{state=succeeded} = %v, want 1", got)
	}
	if _, ok := after.value("batchmr_run_pages_done", "run="+run); ok {
		t.Error("the ended run still has progress series: only active runs may have them")
	}
	grants := after.must(t, "batchmr_semaphore_grants_total", "semaphore=db")
	if grants < float64(st.Total) {
		t.Errorf("batchmr_semaphore_grants_total = %v, want at least one per page (%d)", grants, st.Total)
	}
	if got := after.must(t, "batchmr_semaphore_wait_seconds", "semaphore=db"); got != grants {
		t.Errorf("batchmr_semaphore_wait_seconds has %v observations, want one per grant (%v)", got, grants)
	}
	if got := after.must(t, "batchmr_semaphore_hold_seconds", "semaphore=db"); got != grants {
		t.Errorf("batchmr_semaphore_hold_seconds has %v observations, want one per grant (%v): every permit was released", got, grants)
	}
	if got := after.must(t, "batchmr_semaphore_process_held", "semaphore=db"); got != 0 {
		t.Errorf("batchmr_semaphore_process_held = %v after the run, want 0", got)
	}
	if got, ok := after.value("batchmr_semaphore_leases_lost_total", "semaphore=db"); ok && got != 0 {
		t.Errorf("batchmr_semaphore_leases_lost_total = %v, want 0", got)
	}
}

// /readyz follows Redis: 503 naming Redis while it is unreachable, 200
// again once it is back; /healthz answers 200 throughout, so that an
// orchestrator does not restart workers that would ride the outage out.
func TestReadyzFollowsRedisWhileHealthzStaysUp(t *testing.T) {
	t.Parallel()
	px, url := testenv.RedisProxy(t, testenv.RedisURL(t))
	base := startMetricsWorker(t, worker.Config{RedisURL: url, Prefix: testenv.Prefix(t), PollInterval: 20 * time.Millisecond,
		Permits: map[string]int{"cpu": 2}}, noopJob)
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with Redis up: %d %s", code, body)
	}
	px.Cut()
	var code int
	var body string
	testenv.WaitFor(t, 10*time.Second, "/readyz to fail", func() bool {
		code, body = get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(body, "redis") {
		t.Errorf("/readyz body %q does not name Redis", body)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz during the outage: %d %s, want 200", code, body)
	}
	// A Redis that hangs (accepts, never answers) gets its answer within
	// the 1 s the docs promise, not go-redis's read timeout later, so that
	// a probe with a 1 s timeout sees the 503.
	px.Restore()
	testenv.WaitFor(t, 10*time.Second, "/readyz to answer 200 again", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})
	px.Blackhole()
	began := time.Now()
	code, body = get(t, base+"/readyz")
	// The body proves the 1 s bound fired; the time only rules out
	// go-redis's 3 s read timeout, with slack for a loaded machine.
	if took := time.Since(began); code != http.StatusServiceUnavailable || !strings.Contains(body, "redis: no answer within 1s") || took > 2500*time.Millisecond {
		t.Errorf("/readyz with Redis hanging: %d %q after %v; want 503 naming Redis within about 1s", code, body, took)
	}
	px.Cut()
	if code, _ := get(t, base+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics during the outage: %d, want 200 (with batchmr_fleet_up 0)", code)
	} else if up := scrapeMetrics(t, base).must(t, "batchmr_fleet_up"); up != 0 {
		t.Errorf("batchmr_fleet_up = %v while Redis is unreachable, want 0", up)
	}
	px.Restore()
	testenv.WaitFor(t, 10*time.Second, "/readyz to answer 200 again", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the outage: %d, want 200", code)
	}
}

// /readyz checks the database of a worker that has one.
func TestReadyzNamesAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	_, schema := testenv.Postgres(t)
	u := testenv.DatabaseURLIn(t, schema)
	dbpx := testenv.NewProxy(t, "tcp", hostPort(t, u))
	base := startMetricsWorker(t, worker.Config{RedisURL: testenv.RedisURL(t), DatabaseURL: strings.Replace(u, hostPort(t, u), dbpx.Addr(), 1),
		Prefix: testenv.Prefix(t), PollInterval: 20 * time.Millisecond}, ordersreport.Job)
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with both up: %d %s", code, body)
	}
	dbpx.Cut()
	var body string
	testenv.WaitFor(t, 10*time.Second, "/readyz to fail", func() bool {
		var code int
		code, body = get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(body, "database") || strings.Contains(body, "redis") {
		t.Errorf("/readyz body %q: want it to name the database alone", body)
	}
	dbpx.Restore()
	testenv.WaitFor(t, 10*time.Second, "/readyz to answer 200 again", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})
}

func hostPort(t *testing.T, dbURL string) string {
	t.Helper()
	_, rest, ok := strings.Cut(dbURL, "@")
	if !ok {
		t.Fatalf("database URL %q has no host", dbURL)
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}

// noopJob is a job that needs no database: one page that does nothing.
var noopJob = mapreduce.Job[int, int, int, int]{
	Name:  "noop",
	Split: func(ctx context.Context, _ int, emit func(int) error) error { return emit(0) },
	Map:   func(ctx context.Context, p int) (int, error) { return p, nil },
}

// A metrics address that cannot be listened on stops the worker from
// starting, with an error naming the flag and the fix.
func TestRunRefusesAMetricsAddrInUse(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = worker.Run(ctx, worker.Config{RedisURL: testenv.RedisURL(t), Prefix: testenv.Prefix(t),
		MetricsAddr: taken.Addr().String()}, noopJob)
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr "+taken.Addr().String()) || !strings.Contains(err.Error(), "free port") {
		t.Fatalf("worker.Run with --metrics-addr in use = %v; want an error naming the flag and the fix", err)
	}
}
