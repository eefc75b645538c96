package semaphore

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The control law's constants (docs/semaphore.md, "The control law").
const (
	// minSamples: a window with fewer successes decides nothing; its
	// samples add up with the next window's, for up to maxMerge windows.
	minSamples = 5
	maxMerge   = 5
	// tolerance: a window's mean latency up to (1+tolerance) times the
	// baseline is not queueing.
	tolerance = 0.3
	// probeTolerance: a probe up to (1+probeTolerance) times its baseline
	// says the database has room.
	probeTolerance = 0.5
	// faster: a window this much faster than the baseline says the
	// database got faster (capacity came back): the raises' back-off is
	// forgotten.
	faster = 0.7
	// overloadShare: timeouts in at least this share of a window's
	// outcomes cut N by overloadCut.
	overloadShare = 0.1
	overloadCut   = 0.7
	// refreshEvery: at min, a latency baseline older than this many
	// windows is measured again (it may have risen: a slower database).
	refreshEvery = 60
	// probeMemory: the probe baseline is the tenth percentile of the
	// last probeMemory windows' medians: not the one luckiest.
	probeMemory = 600
	// maxUpWait: without a probe, a raise that queued doubles the clean
	// windows the next raise waits for, up to this many.
	maxUpWait = 32
)

// law decides N each window from what the window's releases reported
// (and a probe's time): a latency gradient against a baseline measured
// at min N, a cut on timeouts, and raises only where the database has
// room. It is pure: RunController feeds it and applies its decisions.
type law struct {
	min, max int
	n        int // N as the law set it

	base    time.Duration // successes' mean latency when nothing queues
	baseAge int           // windows since base was measured
	drain   int           // >0: measuring base at min; windows left
	restore int           // the N to return to after the drain

	probes []time.Duration // per-window probe medians, newest last

	upWait  int  // clean windows a raise to ceiling waits for
	ceiling int  // the N whose raise last queued (0: none)
	clean   int  // clean windows in a row with demand
	raised  bool // the last decision raised N

	merged sample // samples carried over from thin windows
	thin   int    // windows merged into merged
}

// sample is one window's signals.
type sample struct {
	span         time.Duration
	ok, errs     int
	over         int
	okms, busyms float64
	waiting      int
	probe        time.Duration // 0: none
}

// inUse is the mean weight held over the window (Little's law: the sum of
// the hold times over the span).
func (w sample) inUse() float64 {
	if w.span <= 0 {
		return 0
	}
	return w.busyms / float64(w.span.Milliseconds())
}

// decision is what law.next decided.
type decision struct {
	n       int
	reason  string
	latency time.Duration // the window's mean success latency (0: none)
	renew   bool          // set n (false: let the limit fall back)
}

func newLaw(lo, hi, start int) *law {
	return &law{min: lo, max: hi, n: min(max(start, lo), hi), upWait: 1}
}

// probeBase is the tenth percentile of the window probe medians
// remembered.
func (l *law) probeBase() time.Duration {
	if len(l.probes) == 0 {
		return 0
	}
	ps := slices.Clone(l.probes)
	slices.Sort(ps)
	return ps[len(ps)/10]
}

// next decides N for the window w ending at now.
func (l *law) next(w sample, now time.Time) decision {
	if w.probe > 0 {
		l.probes = append(l.probes, w.probe)
		if len(l.probes) > probeMemory {
			l.probes = l.probes[1:]
		}
	}
	if l.thin > 0 {
		w = l.merged.add(w)
	}
	if w.ok+w.errs+w.over == 0 && w.busyms == 0 {
		l.thin, l.merged = 0, sample{}
		return decision{n: l.n, reason: "no releases reported in the window"}
	}
	total := w.ok + w.errs + w.over
	if w.over > 0 && float64(w.over) >= overloadShare*float64(total) {
		l.thin, l.merged = 0, sample{}
		return l.set(int(math.Floor(float64(l.n)*overloadCut)), false,
			fmt.Sprintf("overload: %d of %d queries timed out", w.over, total), 0)
	}
	if w.ok < minSamples && l.thin < maxMerge {
		l.merged, l.thin = w, l.thin+1
		return l.set(l.n, false, fmt.Sprintf("%d successes: adding up with the next window", w.ok), 0)
	}
	l.thin, l.merged = 0, sample{}
	if w.ok == 0 {
		return l.set(l.n, false, fmt.Sprintf("no success in %d windows (%d errors)", maxMerge+1, w.errs), 0)
	}
	lat := time.Duration(w.okms / float64(w.ok) * float64(time.Millisecond))
	l.baseAge++
	if l.drain > 0 {
		l.drain--
		if l.drain > 0 {
			return l.set(l.min, false, "measuring the latency baseline at min: letting queries from above min finish", lat)
		}
		l.base, l.baseAge = lat, 0
		return l.set(l.restore, false, fmt.Sprintf("baseline %v measured at %d", round(lat), l.min), lat)
	}
	switch {
	case l.n <= l.min && (l.base == 0 || l.baseAge > refreshEvery):
		l.base, l.baseAge = lat, 0 // at min: this window is the measure
	case l.base == 0:
		l.drain, l.restore = 2, l.n
		return l.set(l.min, false, "measuring the latency baseline at min", lat)
	}
	return l.judge(w, lat)
}

// judge decides on a window w with enough successes, of mean latency
// lat, against the baseline.
func (l *law) judge(w sample, lat time.Duration) decision {
	if lat < l.base {
		if float64(lat) < faster*float64(l.base) {
			l.ceiling, l.upWait = 0, 1
		}
		l.base, l.baseAge = lat, 0
	}
	ratio := float64(lat) / float64(l.base)
	if ratio > 1+tolerance {
		// Queueing: the database serves what is in use at the baseline's
		// speed only up to capacity ≈ in use × baseline ÷ latency.
		capacity := w.inUse() * float64(l.base) / float64(lat)
		if l.raised {
			l.ceiling, l.upWait = l.n, min(2*l.upWait, maxUpWait)
		}
		l.clean = 0
		n := min(int(math.Round(capacity)), l.n-1)
		return l.set(n, false, fmt.Sprintf("latency %v is %.1f× the baseline %v: capacity ≈ %.1f", round(lat), ratio, round(l.base), capacity), lat)
	}
	if l.raised && l.n >= l.ceiling {
		l.ceiling, l.upWait = 0, 1 // the raise to the ceiling did not queue
	}
	demand := w.waiting > 0 || w.inUse() >= float64(l.n)-0.5
	if !demand {
		l.clean = 0
		return l.set(l.n, false, fmt.Sprintf("latency %v at the baseline; N is not used up", round(lat)), lat)
	}
	l.clean++
	step := max(1, l.n/8)
	if l.n+step >= l.ceiling && l.ceiling > 0 && l.clean < l.upWait {
		return l.set(l.n, false, fmt.Sprintf("latency %v at the baseline; %d queued last time: raising after %d clean windows", round(lat), l.ceiling, l.upWait), lat)
	}
	if w.probe > 0 {
		pb := l.probeBase()
		if float64(w.probe) > (1+probeTolerance)*float64(pb) {
			return l.set(l.n, false, fmt.Sprintf("latency %v at the baseline, but the probe takes %v against %v: no room", round(lat), round(w.probe), round(pb)), lat)
		}
	}
	l.clean = 0
	return l.set(l.n+step, true, fmt.Sprintf("latency %v at the baseline, %d waiting: room", round(lat), w.waiting), lat)
}

// set records n, clamped into the bounds, as the decision.
func (l *law) set(n int, raise bool, reason string, lat time.Duration) decision {
	n = min(max(n, l.min), l.max)
	l.raised = raise && n > l.n
	l.n = n
	return decision{n: n, reason: reason, latency: lat, renew: true}
}

// add merges two windows' samples (the later one's queue and probe).
func (w sample) add(v sample) sample {
	return sample{span: w.span + v.span, ok: w.ok + v.ok, errs: w.errs + v.errs, over: w.over + v.over,
		okms: w.okms + v.okms, busyms: w.busyms + v.busyms, waiting: v.waiting, probe: v.probe}
}

// round rounds d for a reason's text.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}
