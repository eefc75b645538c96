package metrics_test

import (
	"context"
	"log/slog"
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
