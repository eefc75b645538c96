package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultFleetTimeout bounds the Redis reads of one scrape of a Fleet.
const DefaultFleetTimeout = 5 * time.Second

// FleetOptions configure a Fleet. The zero value is usable.
type FleetOptions struct {
	// Timeout bounds the Redis reads of one scrape: what is not read by
	// then is left out of that scrape, and batchmr_fleet_up is 0.
	// Default DefaultFleetTimeout (5s), under Prometheus's default scrape
	// timeout of 10s.
	Timeout time.Duration
	// Logger receives a warning when a scrape cannot read Redis. Default
	// slog.Default().
	Logger *slog.Logger
}

// Fleet is a prometheus.Collector that reads the whole fleet's state from
// Redis at each scrape: each semaphore's limit, holders and waiters, and
// in auto mode its bounds and its controller's last N and window (from
// Semaphore.Stats), and each announced job's runs and the progress of its
// active runs (from the catalogue, Client.Jobs, and Client.Runs). Every
// process scraped with a Fleet reports the same values, labelled only by
// what they describe: scrape one, or aggregate with max without(instance).
//
// A scrape costs one Stats script per semaphore (which also removes
// holders and waiters whose leases ran out, as any Stats does), one
// catalogue read, and one pipelined read of every run within its retention
// per job.
type Fleet struct {
	mr   *mapreduce.Client
	sems []*semaphore.Semaphore
	opts FleetOptions
	mu   sync.Mutex // one scrape at a time reads Redis
}

var _ prometheus.Collector = (*Fleet)(nil)

// NewFleet returns a Fleet reading runs through mr and the semaphores
// sems (the handles of this process: their names and prefix say which
// semaphores to read). mr may be nil (no job series), as may sems.
func NewFleet(mr *mapreduce.Client, sems []*semaphore.Semaphore, opts FleetOptions) *Fleet {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultFleetTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Fleet{mr: mr, sems: sems, opts: opts}
}

var (
	descUp = prometheus.NewDesc("batchmr_fleet_up",
		"1 if the last scrape read the fleet's state from Redis in full, 0 if a read failed or timed out.", nil, nil)
	descSemLimit = prometheus.NewDesc("batchmr_semaphore_limit",
		"The semaphore's fleet-wide limit in Redis (0 if none is set yet).", []string{"semaphore"}, nil)
	descSemHeld = prometheus.NewDesc("batchmr_semaphore_held",
		"Weight of the permits held across the fleet; may exceed the limit briefly after it was lowered.", []string{"semaphore"}, nil)
	descSemHolders = prometheus.NewDesc("batchmr_semaphore_holders",
		"Permits held across the fleet.", []string{"semaphore"}, nil)
	descSemWaiters = prometheus.NewDesc("batchmr_semaphore_waiters",
		"Acquire calls queued across the fleet.", []string{"semaphore"}, nil)
	descSemOldest = prometheus.NewDesc("batchmr_semaphore_oldest_wait_seconds",
		"How long the first queued Acquire has waited; 0 with no waiters.", []string{"semaphore"}, nil)
	descSemOldestHold = prometheus.NewDesc("batchmr_semaphore_oldest_hold_seconds",
		"How long the oldest permit has been held; 0 with no holders.", []string{"semaphore"}, nil)
	descAutoMin = prometheus.NewDesc("batchmr_semaphore_auto_min",
		"Auto mode: the lowest limit the controller may set.", []string{"semaphore"}, nil)
	descAutoMax = prometheus.NewDesc("batchmr_semaphore_auto_max",
		"Auto mode: the highest limit the controller may set.", []string{"semaphore"}, nil)
	descAutoFixed = prometheus.NewDesc("batchmr_semaphore_auto_fixed",
		"Auto mode: the operator's N, the limit whenever no controller's N holds.", []string{"semaphore"}, nil)
	descAutoController = prometheus.NewDesc("batchmr_semaphore_auto_controller_limit",
		"Auto mode: the controller's last N (in shadow mode, the N it would set); 0 before its first.", []string{"semaphore"}, nil)
	descAutoShadow = prometheus.NewDesc("batchmr_semaphore_auto_shadow",
		"1 in shadow mode (the controller's N is recorded, not applied), 0 in auto mode.", []string{"semaphore"}, nil)
	descAutoLatency = prometheus.NewDesc("batchmr_semaphore_auto_latency_seconds",
		"The controller's last window: mean time from grant to release of the successes.", []string{"semaphore"}, nil)
	descAutoBaseline = prometheus.NewDesc("batchmr_semaphore_auto_baseline_seconds",
		"The controller's last window: that time when nothing queues, as the controller measured it.", []string{"semaphore"}, nil)
	descAutoInUse = prometheus.NewDesc("batchmr_semaphore_auto_in_use",
		"The controller's last window: mean weight held.", []string{"semaphore"}, nil)
	descAutoProbe = prometheus.NewDesc("batchmr_semaphore_auto_probe_seconds",
		"The controller's last window: median of the database probes (0 without a probe).", []string{"semaphore"}, nil)
	descAutoProbeBase = prometheus.NewDesc("batchmr_semaphore_auto_probe_baseline_seconds",
		"The controller's last window: the tenth percentile of the probe medians of the last ten minutes.", []string{"semaphore"}, nil)
	descAutoOK = prometheus.NewDesc("batchmr_semaphore_auto_window_ok",
		"The controller's last window: releases that reported success.", []string{"semaphore"}, nil)
	descAutoErrors = prometheus.NewDesc("batchmr_semaphore_auto_window_errors",
		"The controller's last window: releases that reported an error other than a timeout.", []string{"semaphore"}, nil)
	descAutoTimeouts = prometheus.NewDesc("batchmr_semaphore_auto_window_timeouts",
		"The controller's last window: releases that reported a timeout.", []string{"semaphore"}, nil)
	descAutoEpoch = prometheus.NewDesc("batchmr_semaphore_auto_epoch",
		"The controller's last window: its election, counted up by each new controller.", []string{"semaphore"}, nil)
	descAutoAge = prometheus.NewDesc("batchmr_semaphore_auto_window_age_seconds",
		"How long ago the controller sent its last window: a dead controller's ages.", []string{"semaphore"}, nil)
	descJobWorkers = prometheus.NewDesc("batchmr_job_workers",
		"Live workers announcing the job in the catalogue; 0 means its runs would not progress.", []string{"batchmr_job"}, nil)
	descRuns = prometheus.NewDesc("batchmr_runs",
		"Runs of the job within their retention, by state.", []string{"batchmr_job", "state"}, nil)
	descRunPages = prometheus.NewDesc("batchmr_run_pages",
		"Pages of an active run (absent while it splits: the total is not known yet).", []string{"batchmr_job", "run"}, nil)
	descRunDone = prometheus.NewDesc("batchmr_run_pages_done",
		"Pages of an active run recorded as succeeded.", []string{"batchmr_job", "run"}, nil)
	descRunFailed = prometheus.NewDesc("batchmr_run_pages_failed",
		"Pages of an active run recorded as failed for good.", []string{"batchmr_job", "run"}, nil)
	descRunUpdated = prometheus.NewDesc("batchmr_run_last_update_timestamp_seconds",
		"When an active run last changed (a page recorded, a state change), as a Unix time.", []string{"batchmr_job", "run", "state"}, nil)
	descRunStarted = prometheus.NewDesc("batchmr_run_start_timestamp_seconds",
		"When an active run was created or last retried, as a Unix time.", []string{"batchmr_job", "run"}, nil)
)

// Describe implements prometheus.Collector.
func (f *Fleet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descSemLimit, descSemHeld, descSemHolders, descSemWaiters,
		descSemOldest, descSemOldestHold, descAutoMin, descAutoMax, descAutoFixed, descAutoController, descAutoShadow,
		descAutoLatency, descAutoBaseline, descAutoInUse, descAutoProbe, descAutoProbeBase, descAutoOK, descAutoErrors,
		descAutoTimeouts, descAutoEpoch, descAutoAge, descJobWorkers, descRuns, descRunPages, descRunDone, descRunFailed,
		descRunUpdated, descRunStarted} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads Redis within
// FleetOptions.Timeout and sends what it read.
func (f *Fleet) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.Timeout)
	defer cancel()
	up := 1.0
	fail := func(what string, err error) {
		up = 0
		f.opts.Logger.Warn("metrics: reading the fleet's state from Redis failed; this scrape leaves it out", "what", what, "error", err)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, s := range f.sems {
		st, err := s.Stats(ctx)
		if err != nil {
			fail("semaphore "+s.Name(), err)
			continue
		}
		gauge(descSemLimit, float64(st.Limit), st.Name)
		gauge(descSemHeld, float64(st.Held), st.Name)
		gauge(descSemHolders, float64(len(st.Holders)), st.Name)
		gauge(descSemWaiters, float64(len(st.Waiters)), st.Name)
		oldest, oldestHold := 0.0, 0.0
		for _, w := range st.Waiters {
			oldest = max(oldest, w.Age.Seconds())
		}
		for _, h := range st.Holders {
			oldestHold = max(oldestHold, h.HeldFor.Seconds())
		}
		gauge(descSemOldest, oldest, st.Name)
		gauge(descSemOldestHold, oldestHold, st.Name)
		collectAuto(st, gauge)
	}
	if f.mr != nil {
		f.collectJobs(ctx, gauge, fail)
	}
	gauge(descUp, up)
}

// collectAuto sends the auto mode's series of st: none in fixed mode, and
// the controller's last window once it has reported one.
func collectAuto(st semaphore.Stats, gauge func(*prometheus.Desc, float64, ...string)) {
	a := st.Auto
	if a.Mode != semaphore.ModeAuto && a.Mode != semaphore.ModeShadow {
		return
	}
	shadow := 0.0
	if a.Mode == semaphore.ModeShadow {
		shadow = 1
	}
	gauge(descAutoMin, float64(a.Min), st.Name)
	gauge(descAutoMax, float64(a.Max), st.Name)
	gauge(descAutoFixed, float64(a.Fixed), st.Name)
	gauge(descAutoController, float64(a.Controller), st.Name)
	gauge(descAutoShadow, shadow, st.Name)
	g := a.Signals
	if g.Epoch == 0 {
		return
	}
	gauge(descAutoLatency, g.Latency.Seconds(), st.Name)
	gauge(descAutoBaseline, g.Baseline.Seconds(), st.Name)
	gauge(descAutoInUse, g.InUse, st.Name)
	gauge(descAutoProbe, g.Probe.Seconds(), st.Name)
	gauge(descAutoProbeBase, g.ProbeBaseline.Seconds(), st.Name)
	gauge(descAutoOK, float64(g.OK), st.Name)
	gauge(descAutoErrors, float64(g.Errors), st.Name)
	gauge(descAutoTimeouts, float64(g.Overload), st.Name)
	gauge(descAutoEpoch, float64(g.Epoch), st.Name)
	gauge(descAutoAge, g.Age.Seconds(), st.Name)
}

func (f *Fleet) collectJobs(ctx context.Context, gauge func(*prometheus.Desc, float64, ...string), fail func(string, error)) {
	jobs, err := f.mr.Jobs(ctx)
	if err != nil {
		fail("the job catalogue", err)
		return
	}
	states := []mapreduce.State{mapreduce.StateSplitting, mapreduce.StateMapping, mapreduce.StateReducing,
		mapreduce.StateSucceeded, mapreduce.StateFailed, mapreduce.StateCancelled}
	for _, j := range jobs {
		gauge(descJobWorkers, float64(len(j.Workers)), j.Name)
		// Each run's state alone, and the summaries of the runs in
		// progress: a scrape reads no run's arguments or result.
		byState, err := f.mr.CountRuns(ctx, j.Name)
		if err != nil {
			fail("runs of "+j.Name, err)
			continue
		}
		runs, err := f.mr.ActiveRuns(ctx, j.Name)
		if err != nil {
			fail("runs of "+j.Name, err)
			continue
		}
		for _, r := range runs {
			if r.Total >= 0 {
				gauge(descRunPages, float64(r.Total), j.Name, r.ID)
			}
			gauge(descRunDone, float64(r.Done), j.Name, r.ID)
			gauge(descRunFailed, float64(r.Failed), j.Name, r.ID)
			if !r.Updated.IsZero() {
				gauge(descRunUpdated, unix(r.Updated), j.Name, r.ID, string(r.State))
			}
			began := r.Created
			if r.Retried.After(began) {
				began = r.Retried
			}
			if !began.IsZero() {
				gauge(descRunStarted, unix(began), j.Name, r.ID)
			}
		}
		for _, s := range states {
			gauge(descRuns, float64(byState[s]), j.Name, string(s))
		}
	}
}

func unix(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }
