package metrics_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/metrics"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
)

// gather collects cs and returns each series' value (a histogram's count)
// by name and semaphore label.
func gather(t *testing.T, cs ...prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cs...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "semaphore" {
					key += "{" + l.GetValue() + "}"
				}
			}
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// The fleet's view of a semaphore comes from Redis: a permit held by one
// process and a waiter queued by another show up in the scrape of a third
// handle that holds and waits for nothing, with the waiter's age; the
// processes' own series count their grants and waits.
func TestFleetShowsHoldersAndWaitersOfEveryProcessWithTheOldestWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	open := func(obs semaphore.Observer) *semaphore.Semaphore {
		s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	holderObs, waiterObs := metrics.NewObserver(), metrics.NewObserver()
	holder, waiter, scraper := open(holderObs), open(waiterObs), open(nil)
	p, err := holder.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *semaphore.Permit, 1)
	go func() {
		wp, err := waiter.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- wp
	}()
	fleet := metrics.NewFleet(nil, []*semaphore.Semaphore{scraper}, metrics.FleetOptions{})
	var m map[string]float64
	shown := false
	defer func() {
		if !shown {
			t.Logf("the fleet's series: %v", m)
		}
	}()
	testenv.WaitFor(t, 5*time.Second, "the waiter to show in the fleet's series", func() bool {
		m = gather(t, fleet)
		return m["batchmr_semaphore_waiters{db}"] == 1 && m["batchmr_semaphore_oldest_wait_seconds{db}"] > 0
	})
	shown = true
	want := map[string]float64{
		"batchmr_fleet_up":              1,
		"batchmr_semaphore_limit{db}":   1,
		"batchmr_semaphore_held{db}":    1,
		"batchmr_semaphore_holders{db}": 1,
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wp := <-got
	if wp == nil {
		t.FailNow()
	}
	if err := wp.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h := gather(t, holderObs)
	w := gather(t, waiterObs)
	if h["batchmr_semaphore_grants_total{db}"] != 1 || h["batchmr_semaphore_hold_seconds{db}"] != 1 || h["batchmr_semaphore_process_held{db}"] != 0 {
		t.Errorf("holder's own series: %v; want one grant, one hold observed, none held now", h)
	}
	if w["batchmr_semaphore_grants_total{db}"] != 1 || w["batchmr_semaphore_wait_seconds{db}"] != 1 {
		t.Errorf("waiter's own series: %v; want one grant with its wait", w)
	}
	if m := gather(t, fleet); m["batchmr_semaphore_held{db}"] != 0 || m["batchmr_semaphore_waiters{db}"] != 0 || m["batchmr_semaphore_oldest_wait_seconds{db}"] != 0 {
		t.Errorf("after both released, the fleet shows %v; want nothing held or waiting", m)
	}
}

// A scrape while Redis is unreachable does not fail: it leaves the fleet's
// values out and sets batchmr_fleet_up to 0, within its timeout.
func TestFleetScrapeWithoutRedisReportsFleetDown(t *testing.T) {
	t.Parallel()
	px, url := testenv.RedisProxy(t, testenv.RedisURL(t))
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: testenv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	px.Cut()
	m := gather(t, metrics.NewFleet(nil, []*semaphore.Semaphore{s}, metrics.FleetOptions{Timeout: time.Second, Logger: slog.New(slog.DiscardHandler)}))
	if up, ok := m["batchmr_fleet_up"]; !ok || up != 0 {
		t.Errorf("batchmr_fleet_up = %v (present %v), want 0", up, ok)
	}
	if _, ok := m["batchmr_semaphore_limit{db}"]; ok {
		t.Error("a scrape without Redis reported a limit")
	}
}

// autoSeries are the auto mode's series, each with the value Stats gives.
func autoSeries(st semaphore.Stats) map[string]float64 {
	a, g := st.Auto, st.Auto.Signals
	shadow := 0.0
	if a.Mode == semaphore.ModeShadow {
		shadow = 1
	}
	return map[string]float64{
		"batchmr_semaphore_auto_min":                    float64(a.Min),
		"batchmr_semaphore_auto_max":                    float64(a.Max),
		"batchmr_semaphore_auto_fixed":                  float64(a.Fixed),
		"batchmr_semaphore_auto_controller_limit":       float64(a.Controller),
		"batchmr_semaphore_auto_shadow":                 shadow,
		"batchmr_semaphore_auto_latency_seconds":        g.Latency.Seconds(),
		"batchmr_semaphore_auto_baseline_seconds":       g.Baseline.Seconds(),
		"batchmr_semaphore_auto_in_use":                 g.InUse,
		"batchmr_semaphore_auto_probe_seconds":          g.Probe.Seconds(),
		"batchmr_semaphore_auto_probe_baseline_seconds": g.ProbeBaseline.Seconds(),
		"batchmr_semaphore_auto_window_ok":              float64(g.OK),
		"batchmr_semaphore_auto_window_errors":          float64(g.Errors),
		"batchmr_semaphore_auto_window_timeouts":        float64(g.Overload),
		"batchmr_semaphore_auto_epoch":                  float64(g.Epoch),
	}
}

// In auto and shadow mode the fleet's series show the operator's bounds
// and fixed N and the controller's last N and window, as Stats has them;
// in fixed mode there is none of them.
func TestFleetShowsTheAutoModeAndTheControllersLastWindowOutsideFixedModeOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	quiet := slog.New(slog.DiscardHandler)
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 4, Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	fleet := metrics.NewFleet(nil, []*semaphore.Semaphore{sem}, metrics.FleetOptions{})
	noAuto := func(when string) {
		t.Helper()
		for k := range gather(t, fleet) {
			if strings.HasPrefix(k, "batchmr_semaphore_auto_") {
				t.Errorf("%s: the fleet shows %s", when, k)
			}
		}
	}
	if _, err := sem.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sem.SetLimit(ctx, 4); err != nil {
		t.Fatal(err)
	}
	noAuto("in fixed mode")
	if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: 2, Max: 9, Fixed: 5}); err != nil {
		t.Fatal(err)
	}

	// A controller over a load of short permits, with a probe that times
	// a PING, until it has reported a window.
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		probe := func(ctx context.Context) (time.Duration, error) {
			start := time.Now()
			err := rdb.Ping(ctx).Err()
			return time.Since(start), err
		}
		_ = sem.RunController(runCtx, semaphore.ControllerOptions{Window: 100 * time.Millisecond, Probe: probe, Logger: quiet})
	})
	stopLoad := testenv.Loop(t, 4, func(ctx context.Context) {
		_ = sem.Do(ctx, func(context.Context) error { time.Sleep(5 * time.Millisecond); return nil })
	})
	testenv.WaitFor(t, 10*time.Second, "a window of the controller's with its baselines measured", func() bool {
		st, err := sem.Stats(ctx)
		g := st.Auto.Signals
		return err == nil && g.Epoch > 0 && g.Baseline > 0 && g.ProbeBaseline > 0
	})
	stop()
	wg.Wait()
	stopLoad()

	// Nothing moves now: the scrape and Stats agree exactly.
	for _, shadow := range []bool{false, true} {
		if shadow {
			if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: 2, Max: 9, Fixed: 5, Shadow: true}); err != nil {
				t.Fatal(err)
			}
		}
		st, err := sem.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := gather(t, fleet)
		want := autoSeries(st)
		for k, v := range want {
			if got, ok := m[k+"{db}"]; !ok || got != v {
				t.Errorf("shadow %v: %s = %v (present %v), want %v as Stats has it", shadow, k, got, ok, v)
			}
		}
		// The window ages between the Stats and the scrape.
		age, ok := m["batchmr_semaphore_auto_window_age_seconds{db}"]
		if !ok || age < st.Auto.Signals.Age.Seconds() || age > st.Auto.Signals.Age.Seconds()+10 {
			t.Errorf("shadow %v: batchmr_semaphore_auto_window_age_seconds = %v (present %v), want Stats' %v or a little more", shadow, age, ok, st.Auto.Signals.Age)
		}
		want["batchmr_semaphore_auto_window_age_seconds"] = age
		for k := range m {
			if _, ok := want[strings.TrimSuffix(k, "{db}")]; strings.HasPrefix(k, "batchmr_semaphore_auto_") && !ok {
				t.Errorf("shadow %v: the fleet shows %s, which this test does not know", shadow, k)
			}
		}
		if st.Auto.Min != 2 || st.Auto.Max != 9 || st.Auto.Fixed != 5 || st.Auto.Controller < 2 || st.Auto.Controller > 9 {
			t.Errorf("shadow %v: Stats.Auto = %+v; want bounds 2..9, fixed 5, the controller's N within them", shadow, st.Auto)
		}
		for _, k := range []string{"latency_seconds", "baseline_seconds", "in_use", "probe_seconds", "probe_baseline_seconds", "window_ok", "epoch"} {
			if m["batchmr_semaphore_auto_"+k+"{db}"] <= 0 {
				t.Errorf("shadow %v: batchmr_semaphore_auto_%s = %v, want it positive after a window of successes", shadow, k, m["batchmr_semaphore_auto_"+k+"{db}"])
			}
		}
	}
	if err := sem.SetLimit(ctx, 4); err != nil {
		t.Fatal(err)
	}
	noAuto("after SetLimit ended auto mode")
}
