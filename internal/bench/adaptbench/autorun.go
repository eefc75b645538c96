package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// Targets of the auto run.
const (
	settleBand      = 0.25             // N within ±25% of the phase's N*
	settledShare    = 0.9              // for 90% of the rest of the phase
	settleDropMax   = 30 * time.Second // after the capacity drops
	settleReturnMax = 60 * time.Second // after it returns
	protectMax      = 0.5              // reduced-phase p99 ÷ the full-capacity best fixed N's p99 there
	keepMin         = 0.9              // completed queries ÷ the best single fixed N's
)

// A sample is one Stats reading of the auto run.
type sample struct {
	at                   time.Time
	limit, held, waiting int
	auto                 semaphore.AutoState
}

type phaseResult struct {
	cap      capacity
	ci       int // index into sweepResult.caps
	from, to time.Time
	w        window
}

type autoResult struct {
	fixed    int
	start    time.Time
	phases   []phaseResult
	samples  []sample
	cancelAt time.Time
	// fallback is the time from cancelling the controller's context to
	// the first sample whose limit is the fixed N with no controller N
	// holding; fellBack is false if none came before the wait ended.
	fallback time.Duration
	fellBack bool
	lease    time.Duration
	window   time.Duration
	ctlErr   error
	errs     map[string]int
	mu       sync.Mutex // guards samples while sampleStats runs
}

// auto runs the controller through three phases, full, reduced, full,
// sampling Stats, then cancels it and waits for the fixed N.
func (b *bench) auto(ctx context.Context, sr *sweepResult) (*autoResult, error) {
	r := &autoResult{fixed: *fixedFlag}
	if r.fixed == 0 {
		r.fixed = sr.nstar[0]
	}
	r.window = controllerWindow(*ctlWindow)
	r.lease = controllerLease(r.window)
	if err := b.group.SetCores(b.full.cores()); err != nil {
		return nil, err
	}
	if err := b.sem.SetAuto(ctx, semaphore.AutoLimits{Min: autoMin, Max: autoMax, Fixed: r.fixed}); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "adaptbench: auto run: min %d, max %d, fixed %d; phases of %v\n", autoMin, autoMax, r.fixed, *phase)

	stopSampling := b.sampleStats(ctx, r)
	defer stopSampling()

	ctlCtx, stopController := context.WithCancel(ctx)
	defer stopController()
	ctlDone := make(chan error, 1)
	go func() { ctlDone <- runController(ctlCtx, b.sem, b.pool, *ctlWindow, benchLogger()) }()

	if err := b.phases(ctx, sr, r); err != nil {
		return nil, err
	}
	r.errs = b.load.takeErrors()

	// The controller goes away: the limit must fall back to the fixed N.
	r.cancelAt = time.Now()
	stopController()
	if err := r.awaitFallback(ctx); err != nil {
		return nil, err
	}
	select {
	case r.ctlErr = <-ctlDone:
	case <-time.After(10 * time.Second):
		r.ctlErr = fmt.Errorf("RunController had not returned 10s after its context was cancelled")
	}
	stopSampling()
	if *samplesOut != "" {
		if err := r.writeSamples(*samplesOut); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// sampleStats samples the semaphore's Stats into r every -sample-every
// until the returned stop is called (it may be called twice).
func (b *bench) sampleStats(ctx context.Context, r *autoResult) (stop func()) {
	sampleCtx, cancel := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() {
		t := time.NewTicker(*sampleEvery)
		defer t.Stop()
		for {
			st, err := b.sem.Stats(sampleCtx)
			if err == nil {
				s := sample{at: time.Now(), limit: st.Limit, held: st.Held, auto: st.Auto}
				for _, w := range st.Waiters {
					s.waiting += w.Weight
				}
				r.mu.Lock()
				r.samples = append(r.samples, s)
				r.mu.Unlock()
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() {
		cancel()
		sampling.Wait()
	}
}

// phases runs the load through full, reduced and full capacity, -phase
// each, and records each phase's window in r.
func (b *bench) phases(ctx context.Context, sr *sweepResult, r *autoResult) error {
	r.start = time.Now()
	for _, ci := range []int{0, 1, 0} { // full, reduced, full
		c := sr.caps[ci]
		if err := b.group.SetCores(c.cores()); err != nil {
			return err
		}
		p := phaseResult{cap: c, ci: ci, from: time.Now()}
		cpu := b.cpuNow(ctx)
		if err := sleep(ctx, *phase); err != nil {
			return err
		}
		p.to = time.Now()
		p.w = b.load.window(p.from, p.to)
		p.w.pgCores, p.w.otherCores = b.cpuNow(ctx).cores(cpu, p.to.Sub(p.from))
		r.phases = append(r.phases, p)
		fmt.Fprintf(os.Stderr, "adaptbench: auto, %s: %.1f q/s, p50 %.0f ms, p99 %.0f ms; CPU: Postgres %.2f, others %.2f\n",
			c.name, p.w.throughput, ms(p.w.p50), ms(p.w.p99), p.w.pgCores, p.w.otherCores)
	}
	return nil
}

// awaitFallback waits, up to a lease, a window and 30 s after the
// controller's cancel, for a sample of the fixed N with no hold left.
func (r *autoResult) awaitFallback(ctx context.Context) error {
	deadline := r.cancelAt.Add(r.lease + r.window + 30*time.Second)
	for time.Now().Before(deadline) && !r.fellBack {
		if err := sleep(ctx, *sampleEvery); err != nil {
			return err
		}
		r.mu.Lock()
		for _, s := range r.samples {
			if s.at.After(r.cancelAt) && s.limit == r.fixed && s.auto.HoldLeft == 0 {
				r.fallback, r.fellBack = s.at.Sub(r.cancelAt), true
				break
			}
		}
		r.mu.Unlock()
	}
	return nil
}

// inBand reports whether limit is within ±settleBand of nstar.
func inBand(limit, nstar int) bool {
	return float64(limit) >= (1-settleBand)*float64(nstar) && float64(limit) <= (1+settleBand)*float64(nstar)
}

// settle returns, for phase p, the time from its start until the first
// sample in the band around nstar from which at least settledShare of the
// phase's samples are in it (a controller tries a raise now and then, to
// find capacity that came back), ok false if there is none, and the
// fraction of the phase's samples in the band.
func (r *autoResult) settle(p phaseResult, nstar int) (after time.Duration, ok bool, within float64) {
	ss := r.phaseSamples(p)
	if len(ss) == 0 {
		return 0, false, 0
	}
	// inFrom[i]: samples in the band from i on.
	inFrom := make([]int, len(ss)+1)
	for i := len(ss) - 1; i >= 0; i-- {
		inFrom[i] = inFrom[i+1]
		if inBand(ss[i].limit, nstar) {
			inFrom[i]++
		}
	}
	within = float64(inFrom[0]) / float64(len(ss))
	for i, s := range ss {
		if inBand(s.limit, nstar) && float64(inFrom[i]) >= settledShare*float64(len(ss)-i) {
			return s.at.Sub(p.from), true, within
		}
	}
	return 0, false, within
}

func (r *autoResult) phaseSamples(p phaseResult) []sample {
	var out []sample
	for _, s := range r.samples {
		if !s.at.Before(p.from) && s.at.Before(p.to) {
			out = append(out, s)
		}
	}
	return out
}

// trace returns the limit at every step of phase p, as "8 8 6 4 …".
func (r *autoResult) trace(p phaseResult, step time.Duration) string {
	ss := r.phaseSamples(p)
	var parts []string
	next := p.from
	for _, s := range ss {
		if !s.at.Before(next) {
			parts = append(parts, strconv.Itoa(s.limit))
			next = next.Add(step)
		}
	}
	return strings.Join(parts, " ")
}

func (r *autoResult) print(sr *sweepResult) {
	fmt.Printf("## Auto: min %d, max %d, fixed %d; phases of %v, Stats sampled every %v\n\n", autoMin, autoMax, r.fixed, *phase, *sampleEvery)
	fmt.Println("| phase | N* | N: median (range) | within ±25% of N* | settled after | q/s | p50 | p99 | CPU: Postgres / others |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, p := range r.phases {
		nstar := sr.nstar[p.ci]
		ss := r.phaseSamples(p)
		limits := make([]int, len(ss))
		for i, s := range ss {
			limits[i] = s.limit
		}
		med, lo, hi := 0, 0, 0
		if len(limits) > 0 {
			med, lo, hi = benchutil.Median(limits), slices.Min(limits), slices.Max(limits)
		}
		after, ok, within := r.settle(p, nstar)
		settled := "not settled"
		if ok {
			settled = fmt.Sprintf("%.1f s", after.Seconds())
		}
		fmt.Printf("| %s | %d | %d (%d–%d) | %.0f%% | %s | %.1f | %.0f ms | %.0f ms | %.2f / %.2f |\n",
			p.cap, nstar, med, lo, hi, within*100, settled, p.w.throughput, ms(p.w.p50), ms(p.w.p99), p.w.pgCores, p.w.otherCores)
	}
	fmt.Println()
	const traceStep = 2 * time.Second
	fmt.Printf("The limit every %v of each phase:\n\n", traceStep)
	for _, p := range r.phases {
		fmt.Printf("    %-8s %s\n", p.cap.name+":", r.trace(p, traceStep))
	}
	fmt.Println()
	checks := r.checks(sr)
	fmt.Println("| check | measured | target | |")
	fmt.Println("|---|---|---|---|")
	for _, c := range checks {
		verdict := "MISS"
		if c.pass {
			verdict = "PASS"
		}
		fmt.Printf("| %s | %s | %s | %s |\n", c.name, c.value, c.goal, verdict)
	}
	fmt.Println()
	if r.ctlErr != nil {
		fmt.Printf("RunController returned: %v\n\n", r.ctlErr)
	}
	if len(r.errs) > 0 {
		fmt.Printf("Failures during the auto run: %v\n\n", r.errs)
	}
}

// checks judges the run against the targets.
func (r *autoResult) checks(sr *sweepResult) []check {
	var checks []check
	if len(r.phases) == 3 {
		drop, dropOK, dropIn := r.settle(r.phases[1], sr.nstar[1])
		ret, retOK, retIn := r.settle(r.phases[2], sr.nstar[0])
		checks = append(checks,
			settleCheck("settles after the drop", drop, dropOK, dropIn, settleDropMax),
			settleCheck("settles after the return", ret, retOK, retIn, settleReturnMax))

		// The fixed N best at full capacity is the one of its highest
		// throughput: what an operator tuning for the full database picks.
		// Against the knee, N*full, the ratio is shown too.
		ref, knee := sr.at(1, sr.best[0]), sr.at(1, sr.nstar[0])
		ratio := float64(r.phases[1].w.p99) / float64(ref.p99)
		checks = append(checks, check{
			name: "protects: reduced-phase p99 ÷ the p99 at reduced of the fixed N of full capacity's best throughput",
			value: fmt.Sprintf("%.0f ms ÷ %.0f ms (N = %d) = %.3f; against N*full = %d: ÷ %.0f ms = %.3f", ms(r.phases[1].w.p99), ms(ref.p99), sr.best[0], ratio,
				sr.nstar[0], ms(knee.p99), float64(r.phases[1].w.p99)/float64(knee.p99)),
			goal: fmt.Sprintf("≤ %.1f", protectMax), pass: ratio <= protectMax,
		})

		completed := 0
		for _, p := range r.phases {
			completed += p.w.completed
		}
		bestN, bestQ := 0, 0.0
		for _, n := range sr.ns {
			q := 0.0
			for _, p := range r.phases {
				q += sr.at(p.ci, n).throughput * p.to.Sub(p.from).Seconds()
			}
			if q > bestQ {
				bestN, bestQ = n, q
			}
		}
		keep := float64(completed) / bestQ
		checks = append(checks, check{
			name:  "keeps throughput: completed ÷ the best single fixed N's",
			value: fmt.Sprintf("%d ÷ %.0f (N = %d) = %.3f", completed, bestQ, bestN, keep),
			goal:  fmt.Sprintf("≥ %.1f", keepMin), pass: keep >= keepMin,
		})
	}
	maxHeld := 0
	for _, s := range r.samples {
		maxHeld = max(maxHeld, s.held)
	}
	checks = append(checks, check{
		name: "safe: most held in any sample", value: strconv.Itoa(maxHeld),
		goal: fmt.Sprintf("≤ %d (max)", autoMax), pass: maxHeld <= autoMax,
	})
	fb := "never, within the wait"
	if r.fellBack {
		fb = fmt.Sprintf("%.1f s", r.fallback.Seconds())
	}
	checks = append(checks, check{
		name:  "safe: controller gone → fixed N again",
		value: fb,
		goal:  fmt.Sprintf("≤ lease %v + window %v", r.lease, r.window),
		pass:  r.fellBack && r.fallback <= r.lease+r.window,
	})
	return checks
}

type check struct {
	name, value, goal string
	pass              bool
}

func settleCheck(name string, after time.Duration, ok bool, within float64, target time.Duration) check {
	v := fmt.Sprintf("not settled (%.0f%% of the phase within ±25%%)", within*100)
	switch {
	case ok && within == 1:
		v = "0 s: within ±25% throughout the phase"
	case ok:
		v = fmt.Sprintf("%.1f s (%.0f%% of the phase within ±25%%)", after.Seconds(), within*100)
	}
	return check{name: name, value: v, goal: fmt.Sprintf("≤ %v", target), pass: ok && after <= target}
}

// writeSamples writes the samples as CSV: seconds since the auto run
// began, the phase, and the Stats fields.
func (r *autoResult) writeSamples(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"t_s", "phase", "limit", "held", "waiting", "mode", "controller", "hold_left_ms", "why",
		"ok", "overload", "latency_ms", "baseline_ms", "in_use", "probe_ms", "probe_baseline_ms", "reason"})
	msText := func(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', 2, 64) }
	for _, s := range r.samples {
		sig := s.auto.Signals
		ph := "after"
		for _, p := range r.phases {
			if !s.at.Before(p.from) && s.at.Before(p.to) {
				ph = p.cap.name
			}
		}
		_ = w.Write([]string{
			strconv.FormatFloat(s.at.Sub(r.start).Seconds(), 'f', 2, 64), ph,
			strconv.Itoa(s.limit), strconv.Itoa(s.held), strconv.Itoa(s.waiting),
			string(s.auto.Mode), strconv.Itoa(s.auto.Controller),
			strconv.FormatInt(s.auto.HoldLeft.Milliseconds(), 10), s.auto.Why,
			strconv.Itoa(sig.OK), strconv.Itoa(sig.Overload), msText(sig.Latency), msText(sig.Baseline),
			strconv.FormatFloat(sig.InUse, 'f', 2, 64), msText(sig.Probe), msText(sig.ProbeBaseline),
			s.auto.Reason,
		})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
