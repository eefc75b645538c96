package semaphore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/outage"
)

// ControllerOptions configure RunController.
type ControllerOptions struct {
	// Window is how often the controller decides, and the span of the
	// signals each decision reads, unless the operator set one for the
	// fleet (AutoLimits.Window): default 1s.
	Window time.Duration
	// Probe, if set, runs a fixed-cost query on the database the permits
	// guard, outside the semaphore, and returns how long it took. The
	// controller raises N only while probes run as fast as the fastest it
	// has seen (the database has room); without a Probe it raises N by
	// trial, backing off after each raise that queued. pgsource.Probe
	// makes one for Postgres.
	Probe func(ctx context.Context) (time.Duration, error)
	// Logger gets a line for each move of N and why; default the
	// semaphore's (Options.Logger).
	Logger *slog.Logger
}

// ControllerSignals are what the controller read in its last window
// (AutoState.Signals), for metrics and the console.
type ControllerSignals struct {
	Epoch    int64         `json:"epoch"`    // the controller's election, counted up by each new one
	Window   time.Duration `json:"window"`   // the span they cover
	OK       int           `json:"ok"`       // releases that reported success
	Errors   int           `json:"errors"`   // releases that reported another error
	Overload int           `json:"overload"` // releases that reported a timeout
	Latency  time.Duration `json:"latency"`  // the successes' mean time from grant to release
	Baseline time.Duration `json:"baseline"` // that time when nothing queues (see docs/semaphore.md)
	InUse    float64       `json:"in_use"`   // the mean weight held over the window
	Waiting  int           `json:"waiting"`  // requests queued at its end
	Probe    time.Duration `json:"probe"`    // the probes' median (0: no Probe)
	// ProbeBaseline is the tenth percentile of the probe medians of the
	// last ten minutes' windows.
	ProbeBaseline time.Duration `json:"probe_baseline"`
	// Age is how long ago (Redis time) the controller sent them: a dead
	// controller's last window ages.
	Age time.Duration `json:"-"`
}

// RunController makes this process a candidate for the semaphore's
// controller, of which the fleet has one: each window (ControllerOptions)
// it takes or renews the controller's lease in Redis (three windows long;
// a new holder gets a new epoch, and a former holder's moves are
// refused). While it holds the lease and the semaphore is in auto or
// shadow mode (SetAuto), it reads what the releases of every process
// reported in the window (Permit.Report) and, with Probe, the database's
// own speed, and sets N within the operator's bounds, holding for two
// windows: if it stops, its N falls back to the operator's fixed N (see
// docs/semaphore.md for the control law). If Redis loses the auto mode
// (a restart without persistence) while it leads, it sets it again from
// what it last read; SetLimit ends auto mode for good. It returns nil
// when ctx is done. Run it in every process that holds permits: the
// lease keeps one in charge, and another takes over within a lease of
// its death.
func (s *Semaphore) RunController(ctx context.Context, o ControllerOptions) error {
	if o.Window <= 0 {
		o.Window = time.Second
	}
	if o.Logger == nil {
		o.Logger = s.log
	}
	c := &controller{s: s, o: o, log: o.Logger, every: o.Window, probes: outage.New(o.Logger, "semaphore: controller's probe")}
	tick := time.NewTicker(c.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		every := c.every
		if err := c.window(ctx); err != nil && ctx.Err() == nil {
			c.warn(err)
		}
		if c.every != every {
			tick.Reset(c.every) // the operator's window changed
		}
	}
}

// controller is RunController's state.
type controller struct {
	s   *Semaphore
	o   ControllerOptions
	log *slog.Logger

	every   time.Duration // the window: the operator's, else o.Window
	lease   string        // the lease value while this process holds it
	epoch   int64
	law     *law   // nil until it leads in auto or shadow mode
	bounds  string // the AutoState the law was made for: min:max:fixed:mode
	last    counters
	seen    *AutoState // the last auto mode read while leading
	warned  string     // the last warning logged, to log each once
	started time.Time  // when the current window began
	probes  *outage.Log
}

// counters are the signals hash's (control.lua).
type counters struct {
	n, okms, busy, err, over int64
	ended                    bool
}

// window is one tick: campaign, read, decide, apply.
func (c *controller) window(ctx context.Context) error {
	lead, cnt, auto, err := c.campaign(ctx)
	if err != nil || !lead {
		return err
	}
	if auto == "" {
		// Fixed mode, by the operator's choice or by a Redis that lost
		// the auto mode: restore tells which.
		return c.restore(ctx, cnt)
	}
	st, err := c.s.Stats(ctx)
	if err != nil {
		return err
	}
	a := st.Auto
	if a.Mode == ModeFixed {
		return nil // SetLimit came between the two calls
	}
	c.seen = &a
	now := time.Now()
	key := fmt.Sprintf("%s:%d:%d:%d", a.Mode, a.Min, a.Max, a.Fixed)
	if c.law == nil || c.bounds != key {
		start := st.Limit
		if a.Mode == ModeShadow && a.Controller > 0 {
			start = a.Controller
		}
		c.law, c.bounds = newLaw(a.Min, a.Max, start), key
		c.last, c.started = cnt, now
		return nil
	}
	w := sample{
		span:    now.Sub(c.started),
		ok:      int(cnt.n - c.last.n),
		okms:    float64(cnt.okms - c.last.okms),
		busyms:  float64(cnt.busy - c.last.busy),
		errs:    int(cnt.err - c.last.err),
		over:    int(cnt.over - c.last.over),
		waiting: len(st.Waiters),
	}
	c.last, c.started = cnt, now
	if w.ok < 0 || w.busyms < 0 || w.errs < 0 || w.over < 0 {
		return nil // the counters were reset (Redis lost them): start afresh
	}
	if c.o.Probe != nil {
		w.probe = c.probe(ctx)
	}
	return c.apply(ctx, st, w, c.law.next(w, now))
}

// campaign takes or renews the controller's lease and reads the signals'
// counters and the auto mode's record ("": fixed mode).
func (c *controller) campaign(ctx context.Context) (lead bool, cnt counters, auto string, err error) {
	lease := 3 * c.every
	remembers := "0" // an auto mode to restore if Redis lost it
	if c.seen != nil {
		remembers = "1"
	}
	res, err := c.s.eval(ctx, scriptControl, c.s.process, lease.Milliseconds(), remembers)
	if err != nil {
		return false, cnt, "", fmt.Errorf("campaigning for the controller's lease: %w", err)
	}
	vals, _ := res.([]any)
	if len(vals) != 10 {
		return false, cnt, "", fmt.Errorf("campaigning for the controller's lease: unexpected reply %v", res)
	}
	holder, _ := vals[0].(string)
	if l, _ := vals[1].(int64); l != 1 {
		if c.lease != "" {
			c.log.Info("semaphore: this process no longer controls the limit", "controller", holder)
		}
		c.lease, c.law, c.seen = "", nil, nil
		return false, cnt, "", nil
	}
	if c.lease != holder {
		// A new lease: won now, or won again at once after Redis lost the
		// last (this process's law and memory of the mode then go on).
		if c.lease == "" {
			c.law, c.seen = nil, nil
		}
		c.lease = holder
		epoch, _, _ := strings.Cut(holder, ":")
		c.epoch, _ = strconv.ParseInt(epoch, 10, 64)
		c.log.Info("semaphore: this process now controls the limit", "epoch", c.epoch)
	}
	c.every = c.o.Window
	if w := parseInt(vals[9]); w > 0 {
		c.every = ms(w)
	}
	return true, parseCounters(vals[2:]), str(vals[8]), nil
}

// apply sets the law's decision d, taken on the window w, as the limit
// (in shadow mode, records it), and logs a move.
func (c *controller) apply(ctx context.Context, st Stats, w sample, d decision) error {
	a := st.Auto
	if !d.renew {
		if d.reason != c.warned {
			c.log.Info("semaphore: the controller has no signals; the limit falls back to the fixed N", "reason", d.reason, "fixed", a.Fixed)
			c.warned = d.reason
		}
		return nil
	}
	c.warned = ""
	sig, _ := json.Marshal(ControllerSignals{
		Epoch: c.epoch, Window: w.span, OK: w.ok, Errors: w.errs, Overload: w.over,
		Latency: d.latency, Baseline: c.law.base, InUse: w.inUse(), Waiting: w.waiting,
		Probe: w.probe, ProbeBaseline: c.law.probeBase(),
	})
	prev := st.Limit
	if a.Mode == ModeShadow {
		prev = a.Controller
	}
	if _, err := c.s.adapt(ctx, c.lease, d.n, 2*c.every, d.reason, string(sig)); err != nil {
		if errors.Is(err, errNotController) {
			c.lease, c.law = "", nil
		}
		return err
	}
	if d.n != prev {
		c.log.Info("semaphore: the controller moved the limit", "from", prev, "to", d.n, "mode", a.Mode,
			"reason", d.reason, "min", a.Min, "max", a.Max)
	}
	return nil
}

// restore sets the auto mode again, and the controller's last N, when
// Redis lost them while this process led (the signals hash has no
// "ended": SetLimit did not end it). Otherwise fixed mode stands, and the
// law is dropped.
func (c *controller) restore(ctx context.Context, cnt counters) error {
	a := c.seen
	c.seen = nil
	if a == nil || cnt.ended || c.law == nil {
		c.law = nil
		return nil
	}
	c.log.Warn("semaphore: Redis lost the auto mode (a restart or failover without the keys); setting it again",
		"min", a.Min, "max", a.Max, "fixed", a.Fixed, "mode", a.Mode, "limit", c.law.n)
	if err := c.s.SetAuto(ctx, AutoLimits{Min: a.Min, Max: a.Max, Fixed: a.Fixed, Shadow: a.Mode == ModeShadow, Window: a.Window}); err != nil {
		c.seen = a
		return err
	}
	c.last, c.started = counters{}, time.Now() // the counters are gone too
	_, err := c.s.adapt(ctx, c.lease, c.law.n, 2*c.every, "restored after Redis lost the auto mode", "")
	return err
}

// probe runs the Probe three times and returns the median (0 if each
// failed).
func (c *controller) probe(ctx context.Context) time.Duration {
	var ds []time.Duration
	for range 3 {
		pctx, cancel := context.WithTimeout(ctx, c.every)
		d, err := c.o.Probe(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				c.probes.Failed(nil, outage.Database, "", err)
			}
			continue
		}
		c.probes.Ended(outage.Database, "")
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// warn logs err once until another comes. A Redis outage is the
// handle's outage log's to tell.
func (c *controller) warn(err error) {
	if mayPass(err) {
		c.log.Debug("semaphore: controller", "error", err)
		return
	}
	if msg := err.Error(); msg != c.warned {
		c.log.Warn("semaphore: controller", "error", err)
		c.warned = msg
	}
}

// parseCounters reads control.lua's counters.
func parseCounters(v []any) counters {
	return counters{n: parseInt(v[0]), okms: parseInt(v[1]), busy: parseInt(v[2]), err: parseInt(v[3]), over: parseInt(v[4]), ended: str(v[5]) != ""}
}

// Outcomes a release reports (report, scripts/lib.lua).
const (
	outcomeOK       = 'o'
	outcomeError    = 'e'
	outcomeOverload = 'x'
	outcomeNone     = '-' // a cancel: its time counts, not its outcome
)

// outcomeOf classifies the error of a permit's work (Permit.Report).
func outcomeOf(err error) byte {
	if err == nil {
		return outcomeOK
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return outcomeOverload
	}
	var t interface{ Timeout() bool }
	if errors.As(err, &t) && t.Timeout() {
		return outcomeOverload
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		switch code := pg.SQLState(); {
		case code == "57014", // query_canceled: a statement timeout, or a cancel
			code == "55P03",                    // lock_not_available: a lock timeout
			len(code) == 5 && code[:2] == "53": // insufficient resources: too many connections, out of memory
			if errors.Is(err, context.Canceled) {
				return outcomeNone // our own cancel, sent to the server
			}
			return outcomeOverload
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed) {
		return outcomeNone
	}
	return outcomeError
}
