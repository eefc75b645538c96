package semaphore

import (
	"math"
	"testing"
	"time"
)

// cpuBound models a database whose queries are CPU-bound: each costs cost
// of one core's time, and the server has capacity cores, shared fairly.
// A window's N queries in use each run at min(1, capacity/N) of a core.
// The probe costs a fixed bit of CPU and competes with them.
type cpuBound struct {
	capacity float64
	cost     time.Duration
}

// window is what a law sees of a window of span at limit n with every
// permit in use and more work waiting.
func (db cpuBound) window(n int, span time.Duration) sample {
	slow := math.Max(1, float64(n)/db.capacity)
	lat := time.Duration(float64(db.cost) * slow)
	done := int(float64(span) / float64(lat) * float64(n))
	probe := time.Duration(float64(time.Millisecond) * math.Max(1, float64(n+1)/db.capacity))
	return sample{span: span, ok: done, okms: float64(done) * float64(lat) / 1e6,
		busyms: float64(n) * float64(span.Milliseconds()), waiting: 10, probe: probe}
}

// run feeds the law windows of db for windows and returns the Ns it set.
func run(l *law, db cpuBound, windows int, probe bool) []int {
	var ns []int
	for range windows {
		w := db.window(l.n, time.Second)
		if !probe {
			w.probe = 0
		}
		d := l.next(w, time.Time{})
		ns = append(ns, d.n)
	}
	return ns
}

// settled returns the first window within lo..hi from which at least 90%
// of the windows are (a controller must try a raise now and then to find
// capacity that came back), or -1.
func settled(ns []int, lo, hi int) int {
	for i, n := range ns {
		if n >= lo && n <= hi && share(ns[i:], lo, hi) >= 0.9 {
			return i
		}
	}
	return -1
}

// share is the fraction of ns within lo..hi.
func share(ns []int, lo, hi int) float64 {
	in := 0
	for _, n := range ns {
		if n >= lo && n <= hi {
			in++
		}
	}
	return float64(in) / float64(len(ns))
}

// With a probe, the law finds a CPU-bound database's cores, follows them
// down when capacity drops and up when it returns, and never probes above
// the reduced capacity once there (every raise would queue).
func TestTheLawFollowsACPUBoundDatabasesCapacity(t *testing.T) {
	l := newLaw(1, 64, 16)
	full, reduced := cpuBound{2, 20 * time.Millisecond}, cpuBound{0.5, 20 * time.Millisecond}
	a := run(l, full, 120, true)
	if at := settled(a, 2, 2); at < 0 || at > 30 {
		t.Errorf("full capacity (2 cores), from 16: Ns %v; want 2 within 30 windows, and at least 90%% of the time after", a)
	}
	b := run(l, reduced, 120, true)
	if at := settled(b, 1, 1); at < 0 || at > 30 || share(b[30:], 1, 1) < 0.99 {
		t.Errorf("reduced capacity (0.5 core): Ns %v; want 1 within 30 windows and nothing above it after", b)
	}
	c := run(l, full, 120, true)
	if at := settled(c, 2, 2); at < 0 || at > 60 {
		t.Errorf("capacity back (2 cores): Ns %v; want 2 within 60 windows, and at least 90%% of the time after", c)
	}
}

// Without a probe, the law raises N by trial, and each raise that queued
// doubles the wait before the next: it stays near capacity, not above.
func TestWithoutAProbeTheLawRaisesByTrialAndBacksOff(t *testing.T) {
	l := newLaw(1, 64, 4)
	ns := run(l, cpuBound{4, 20 * time.Millisecond}, 300, false)
	if share(ns[60:], 4, 5) < 0.9 {
		t.Errorf("4 cores, no probe: Ns %v; want 4 or 5 at least 90%% of the time after a minute", ns)
	}
	raises := 0
	for i := 61; i < len(ns); i++ {
		if ns[i] > ns[i-1] {
			raises++
		}
	}
	if raises > 20 {
		t.Errorf("4 cores, no probe: %d raises in 240 windows; want the trials backed off", raises)
	}
}

// N never leaves [min, max], whatever the database does.
func TestTheLawKeepsNWithinItsBounds(t *testing.T) {
	l := newLaw(3, 6, 1)
	if l.n != 3 {
		t.Fatalf("a start below min = %d, want min 3", l.n)
	}
	for _, db := range []cpuBound{{64, time.Millisecond}, {0.1, 100 * time.Millisecond}} {
		for i, n := range run(l, db, 100, true) {
			if n < 3 || n > 6 {
				t.Fatalf("capacity %v: window %d set %d, outside [3, 6]", db.capacity, i, n)
			}
		}
	}
	ns := run(newLaw(1, 64, 8), cpuBound{64, time.Millisecond}, 200, true)
	if ns[len(ns)-1] != 64 {
		t.Errorf("a database with room for 64: Ns %v; want N raised to max 64", ns)
	}
}

// Timeouts cut N though latency does not move; errors are no latency
// samples, and one fast window of a few samples sets no baseline.
func TestTheLawCutsOnTimeoutsAndTakesNoErrorOrLuckySampleForSpeed(t *testing.T) {
	l := newLaw(1, 64, 10)
	l.base, l.n = 20*time.Millisecond, 10
	steady := sample{span: time.Second, ok: 450, okms: 450 * 20, busyms: 10000, over: 50, waiting: 5}
	if d := l.next(steady, time.Time{}); d.n != 7 {
		t.Errorf("10%% timeouts at baseline latency: N %d (%s), want 10 cut to 7", d.n, d.reason)
	}
	l = newLaw(1, 64, 10)
	l.base, l.n = 20*time.Millisecond, 10
	// Fast failures next to slow successes: the latency is the successes'.
	errs := sample{span: time.Second, ok: 200, okms: 200 * 50, busyms: 10000, errs: 800, waiting: 5}
	if d := l.next(errs, time.Time{}); d.n >= 10 || d.latency != 50*time.Millisecond {
		t.Errorf("800 fast errors beside 200 successes of 50ms: N %d, latency %v (%s); want the cut of 2.5× the baseline", d.n, d.latency, d.reason)
	}
	l = newLaw(1, 64, 10)
	l.base, l.n = 20*time.Millisecond, 10
	lucky := sample{span: time.Second, ok: 2, okms: 2, busyms: 10000, waiting: 5}
	l.next(lucky, time.Time{})
	if l.base != 20*time.Millisecond {
		t.Errorf("2 samples of 1ms moved the baseline to %v; want it kept at 20ms until %d samples", l.base, minSamples)
	}
}

// Mild overload (latency just above the tolerance, steadily) brings N
// down rather than letting it grow.
func TestTheLawDoesNotGrowUnderMildOverload(t *testing.T) {
	l := newLaw(1, 64, 16)
	l.base, l.n = 20*time.Millisecond, 16
	for i := range 20 {
		lat := 27 * time.Millisecond // 1.35× the baseline at any N
		w := sample{span: time.Second, ok: 500, okms: 500 * float64(lat.Milliseconds()), busyms: float64(l.n) * 1000, waiting: 5}
		if d := l.next(w, time.Time{}); d.n > 16 {
			t.Fatalf("window %d: N %d under steady 1.35× latency; want no growth", i, d.n)
		}
	}
	if l.n >= 16 {
		t.Errorf("N %d after 20 windows of 1.35× latency, want it cut", l.n)
	}
}
