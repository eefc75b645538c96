package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
)

// Observer keeps the per-process series: what this process's semaphore
// handles granted and released, and the steps and run outcomes of its
// mapreduce Client. It implements semaphore.Observer, mapreduce.Observer
// and prometheus.Collector; pass it as semaphore.Options.Observer and
// mapreduce.Config.Observer, and register it once. Its methods are safe for
// concurrent use and never block on anything but the metrics' own locks.
type Observer struct {
	semWait, semHold           *prometheus.HistogramVec
	semGrants, semLost         *prometheus.CounterVec
	semHeldHere                *prometheus.GaugeVec
	pageDuration, stepDuration *prometheus.HistogramVec
	pagesDone, pagesFailed     *prometheus.CounterVec
	stepsActive                *prometheus.GaugeVec
	runDuration                *prometheus.HistogramVec
	runsEnded                  *prometheus.CounterVec
}

var (
	_ semaphore.Observer   = (*Observer)(nil)
	_ mapreduce.Observer   = (*Observer)(nil)
	_ prometheus.Collector = (*Observer)(nil)
)

// Step outcomes, the "outcome" label of step series.
const (
	OutcomeSucceeded = "succeeded" // the step did its work and recorded it
	OutcomeFailed    = "failed"    // the attempt failed; asynq retries it unless it was the last
	OutcomeEnded     = "ended"     // the run was cancelled or ended while the step worked
	// OutcomeHandedBack: the worker handed the task back without doing its
	// work (it is stopping and the step had no permit yet), for another
	// attempt that spends no retry.
	OutcomeHandedBack = "handed_back"
)

// NewObserver returns an Observer with every series at zero.
func NewObserver() *Observer {
	sem := []string{"semaphore"}
	return &Observer{
		semWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "batchmr_semaphore_wait_seconds",
			Help:    "Time an Acquire in this process waited for its permit, by semaphore.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms to 4m
		}, sem),
		semHold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "batchmr_semaphore_hold_seconds",
			Help:    "Time a permit granted in this process was held until released, by semaphore.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, sem),
		semGrants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batchmr_semaphore_grants_total",
			Help: "Permits granted to this process, by semaphore.",
		}, sem),
		semLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batchmr_semaphore_leases_lost_total",
			Help: "Permits of this process whose lease was lost before release (the work they guarded was cancelled), by semaphore.",
		}, sem),
		semHeldHere: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "batchmr_semaphore_process_held",
			Help: "Weight of the permits this process holds now, by semaphore.",
		}, sem),
		pageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "batchmr_page_duration_seconds",
			Help:    "Time one attempt of a page (its Map and the recording of its outcome) took in this process, by job and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10), // 5ms to 22m
		}, []string{"batchmr_job", "outcome"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "batchmr_step_duration_seconds",
			Help:    "Time one attempt of a run's split or reduce took in this process, by job, step and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"batchmr_job", "step", "outcome"}),
		pagesDone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batchmr_pages_done_total",
			Help: "Pages whose result this process recorded, by job.",
		}, []string{"batchmr_job"}),
		pagesFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batchmr_pages_failed_total",
			Help: "Pages this process recorded as failed for good (their retries spent), by job.",
		}, []string{"batchmr_job"}),
		stepsActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "batchmr_steps_in_progress",
			Help: "Steps at work in this process now, by job and step (split, map, reduce).",
		}, []string{"batchmr_job", "step"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "batchmr_run_duration_seconds",
			Help:    "Time from a run's creation (or last retry) to its end, for the runs this process ended, by job and state.",
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 11), // 100ms to 29h
		}, []string{"batchmr_job", "state"}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batchmr_runs_ended_total",
			Help: "Runs this process ended (each run is ended by one process of the fleet), by job and state.",
		}, []string{"batchmr_job", "state"}),
	}
}

func (o *Observer) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.semWait, o.semHold, o.semGrants, o.semLost, o.semHeldHere,
		o.pageDuration, o.stepDuration, o.pagesDone, o.pagesFailed, o.stepsActive, o.runDuration, o.runsEnded}
}

// Describe implements prometheus.Collector.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.collectors() {
		c.Collect(ch)
	}
}

// Granted implements semaphore.Observer.
func (o *Observer) Granted(sem string, weight int, waited time.Duration) {
	o.semGrants.WithLabelValues(sem).Inc()
	o.semWait.WithLabelValues(sem).Observe(waited.Seconds())
	o.semHeldHere.WithLabelValues(sem).Add(float64(weight))
}

// Released implements semaphore.Observer.
func (o *Observer) Released(sem string, weight int, held time.Duration) {
	o.semHold.WithLabelValues(sem).Observe(held.Seconds())
	o.semHeldHere.WithLabelValues(sem).Sub(float64(weight))
}

// LeaseLost implements semaphore.Observer.
func (o *Observer) LeaseLost(sem string, weight int) {
	o.semLost.WithLabelValues(sem).Inc()
}

// Step implements mapreduce.Observer: it times the step and counts the
// pages it records. It returns ctx unchanged.
func (o *Observer) Step(ctx context.Context, s mapreduce.Step) (context.Context, func(error)) {
	active := o.stepsActive.WithLabelValues(s.Job, string(s.Kind))
	active.Inc()
	began := time.Now()
	return ctx, func(err error) {
		active.Dec()
		took := time.Since(began).Seconds()
		outcome := outcomeOf(err)
		if s.Kind != mapreduce.StepMap {
			o.stepDuration.WithLabelValues(s.Job, string(s.Kind), outcome).Observe(took)
			return
		}
		o.pageDuration.WithLabelValues(s.Job, outcome).Observe(took)
		switch {
		case err == nil:
			o.pagesDone.WithLabelValues(s.Job).Inc()
		case outcome == OutcomeFailed && errors.Is(err, asynq.SkipRetry):
			// The handler recorded the page as failed before returning a
			// final error.
			o.pagesFailed.WithLabelValues(s.Job).Inc()
		}
	}
}

// RunEnded implements mapreduce.Observer.
func (o *Observer) RunEnded(job, runID string, state mapreduce.State, took time.Duration) {
	o.runsEnded.WithLabelValues(job, string(state)).Inc()
	o.runDuration.WithLabelValues(job, string(state)).Observe(took.Seconds())
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return OutcomeSucceeded
	case errors.Is(err, mapreduce.ErrRunCancelled), errors.Is(err, mapreduce.ErrRunEnded):
		return OutcomeEnded
	case errors.Is(err, mapreduce.ErrHandedBack):
		return OutcomeHandedBack
	}
	return OutcomeFailed
}
