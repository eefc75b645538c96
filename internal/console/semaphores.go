package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// sample is one reading of a semaphore's Stats.
type sample struct {
	at                   time.Time
	limit, held, waiters int
	shadow               int // in shadow mode, the controller's last N (0: none, or another mode)
}

// ring keeps a semaphore's last samples, oldest first.
type ring struct {
	buf  []sample
	next int
	full bool
}

func (r *ring) add(s sample) {
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	r.full = r.full || r.next == 0
}

func (r *ring) samples() []sample {
	if !r.full {
		return slices.Clone(r.buf[:r.next])
	}
	return append(slices.Clone(r.buf[r.next:]), r.buf[:r.next]...)
}

// Sample reads the Stats of every semaphore live workers announce, every
// Config.SampleEvery, into the charts' history, until ctx is done or
// Close is called. Errors are logged and the next tick tries again. Run
// one Sample per Console.
func (c *Console) Sample(ctx context.Context) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.sampling.Add(1)
	c.mu.Unlock()
	defer c.sampling.Done()
	t := time.NewTicker(c.cfg.SampleEvery)
	defer t.Stop()
	for {
		c.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
	}
}

func (c *Console) sampleOnce(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, c.cfg.SampleEvery+time.Second)
	defer cancel()
	var failed error
	defer func() {
		if parent.Err() == nil { // stopping is no failure, nor a recovery
			c.noteSample(failed)
		}
	}()
	names, err := c.announced(ctx)
	if err != nil {
		// Past the sample's own deadline too: a Redis that hangs fails
		// every sample that way.
		failed = fmt.Errorf("listing workers: %w", err)
		return
	}
	c.mu.Lock()
	for name := range c.history {
		if !slices.Contains(names, name) {
			names = append(names, name) // keep charting it while it has history
		}
	}
	c.mu.Unlock()
	for _, name := range names {
		if _, err := c.stats(ctx, name, true); err != nil && failed == nil {
			failed = fmt.Errorf("semaphore %q: %w", name, err)
		}
	}
}

// sampleWarnEvery is how often the sampler repeats its warning while its
// samples keep failing (Redis away, say): every second would flood the log.
const sampleWarnEvery = time.Minute

// noteSample logs the sampler's failures: a warning when they start and
// once a minute while they go on, and when sampling works again.
func (c *Console) noteSample(err error) {
	now := time.Now()
	switch {
	case err == nil && !c.sampleFailingSince.IsZero():
		c.log.Info("console: sampling semaphores works again", "failed_for", now.Sub(c.sampleFailingSince).Round(time.Second))
		c.sampleFailingSince, c.sampleWarned = time.Time{}, time.Time{}
	case err == nil:
	case c.sampleFailingSince.IsZero():
		c.sampleFailingSince, c.sampleWarned = now, now
		c.log.Warn("console: sampling semaphores failed; the charts have a gap until it works again (logged once a minute meanwhile)", "error", err)
	case now.Sub(c.sampleWarned) >= sampleWarnEvery:
		c.sampleWarned = now
		c.log.Warn("console: sampling semaphores still fails", "for", now.Sub(c.sampleFailingSince).Round(time.Second), "error", err)
	}
}

// announced returns the semaphores live workers announce, sorted.
func (c *Console) announced(ctx context.Context) ([]string, error) {
	workers, err := c.cfg.MapReduce.Workers(ctx)
	if err != nil {
		return nil, err
	}
	return semaphoresOf(workers), nil
}

// semaphoresOf returns the semaphores workers announce, sorted.
func semaphoresOf(workers []mapreduce.WorkerInfo) []string {
	var names []string
	for _, w := range workers {
		names = append(names, w.Semaphores...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// workersNow returns the live workers and Redis's time now, against which
// their heartbeats are judged (app.WorkerOf): read once per page, however
// many semaphores it shows.
func (c *Console) workersNow(ctx context.Context) ([]mapreduce.WorkerInfo, time.Time, error) {
	workers, err := c.cfg.MapReduce.Workers(ctx)
	return workers, time.Now().Add(app.RedisSkew(ctx, c.cfg.Redis)), err
}

// handle returns this console's handle on the named semaphore.
func (c *Console) handle(name string) (*semaphore.Semaphore, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.sems[name]; ok {
		return s, nil
	}
	if c.closed {
		return nil, fmt.Errorf("console: closed")
	}
	// The limit given is never written: Stats and SetLimit do not use it.
	s, err := semaphore.New(c.cfg.Redis, name, semaphore.Options{Limit: 1, Prefix: c.cfg.SemaphorePrefix, Logger: c.log})
	if err != nil {
		return nil, err
	}
	c.sems[name] = s
	return s, nil
}

// stats reads the semaphore's Stats and, if record, adds them to its
// chart (only Sample does, so that the chart's samples are evenly spaced).
func (c *Console) stats(ctx context.Context, name string, record bool) (semaphore.Stats, error) {
	s, err := c.handle(name)
	if err != nil {
		return semaphore.Stats{}, err
	}
	st, err := s.Stats(ctx)
	if err != nil {
		return st, err
	}
	if st.Limit == 0 || !record {
		return st, nil // nothing to chart: not in use yet
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.history[name]
	if h == nil {
		h = &ring{buf: make([]sample, c.cfg.History)}
		c.history[name] = h
	}
	x := sample{at: time.Now(), limit: st.Limit, held: st.Held, waiters: len(st.Waiters)}
	if st.Auto.Mode == semaphore.ModeShadow {
		x.shadow = st.Auto.Controller
	}
	h.add(x)
	return st, nil
}

type semRow struct {
	semaphore.Stats
	Link      string
	Processes []procRow
	Waiting   int // the waiters' weight
	// AutoText and Window: in auto or shadow mode, AutoText and
	// WindowText of st.Auto; "" in fixed mode.
	AutoText, Window string
	Chart            chart
}

// procRow is a process of a semaphore, with the live worker it belongs to
// ("(none)": it stopped or was killed, or is no worker).
type procRow struct {
	semaphore.ProcessStats
	Worker string
}

// semRow is st as the pages show it, each process with its worker among
// workers as of now (workersNow).
func (c *Console) semRow(st semaphore.Stats, workers []mapreduce.WorkerInfo, now time.Time) semRow {
	r := semRow{Stats: st, Link: "/semaphore?" + url.Values{"name": {st.Name}}.Encode()}
	for _, p := range st.ByProcess() {
		r.Processes = append(r.Processes, procRow{ProcessStats: p, Worker: WorkerOf(p.Process, workers, now)})
	}
	for _, q := range st.Waiters {
		r.Waiting += q.Weight
	}
	if st.Auto.Mode == semaphore.ModeAuto || st.Auto.Mode == semaphore.ModeShadow {
		r.AutoText, r.Window = AutoText(st.Auto), WindowText(st.Auto.Signals)
	}
	c.mu.Lock()
	var hist []sample
	if h := c.history[st.Name]; h != nil {
		hist = h.samples()
	}
	c.mu.Unlock()
	r.Chart = drawChart(hist, time.Duration(c.cfg.History)*c.cfg.SampleEvery)
	return r
}

type semaphoresView struct {
	Semaphores []semRow
}

func (c *Console) semaphoresData(ctx context.Context, _ *http.Request) (string, string, any, error) {
	workers, now, err := c.workersNow(ctx)
	if err != nil {
		return "Semaphores", "/semaphores/live", nil, err
	}
	var v semaphoresView
	for _, name := range semaphoresOf(workers) {
		st, err := c.stats(ctx, name, false)
		if err != nil {
			return "Semaphores", "/semaphores/live", nil, err
		}
		v.Semaphores = append(v.Semaphores, c.semRow(st, workers, now))
	}
	return "Semaphores", "/semaphores/live", v, nil
}

type semaphoreView struct {
	semRow
	Input   string // the limit the form shows: the one refused, or the current one
	Confirm int    // a limit asked for that is a large jump, to confirm; 0: none
}

// A limit raised more than bigRaise times, and by more than bigRaiseMin,
// is set only once confirmed: the permits protect the database, and 1000
// for 10 is a typo away.
const (
	bigRaise    = 4
	bigRaiseMin = 8
)

// known returns the semaphore's stats, or a 404 error when Redis has no
// limit for it and no live worker uses it (what `scheduler permits get`
// calls no semaphore).
func (c *Console) known(ctx context.Context, name string) (semaphore.Stats, error) {
	if name == "" || strings.ContainsAny(name, "{}") {
		return semaphore.Stats{}, notFound("No semaphore %q.", name)
	}
	names, err := c.announced(ctx)
	if err != nil {
		return semaphore.Stats{}, err
	}
	if slices.Contains(names, name) || c.cached(name) {
		return c.stats(ctx, name, false)
	}
	// A name from the request: look with a handle of its own, kept only
	// if the semaphore exists, so that made-up names cost nothing.
	s, err := semaphore.New(c.cfg.Redis, name, semaphore.Options{Limit: 1, Prefix: c.cfg.SemaphorePrefix, Logger: c.log})
	if err != nil {
		return semaphore.Stats{}, notFound("No semaphore %q: %v", name, err)
	}
	st, err := s.Stats(ctx)
	_ = s.Close()
	if err != nil {
		return st, err
	}
	if st.Limit == 0 {
		return st, notFound("No semaphore %q: Redis has no limit for it and no live worker uses it.", name)
	}
	return c.stats(ctx, name, false)
}

func (c *Console) cached(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.sems[name]
	return ok
}

func (c *Console) semaphoreData(ctx context.Context, r *http.Request) (string, string, any, error) {
	name := r.FormValue("name")
	live := "/semaphore/live?" + url.Values{"name": {name}}.Encode()
	st, err := c.known(ctx, name)
	if err != nil {
		return "Semaphore not found", live, nil, err
	}
	workers, now, _ := c.workersNow(ctx) // without them, each process shows "(none)"
	return "Semaphore " + name, live, semaphoreView{semRow: c.semRow(st, workers, now), Input: strconv.Itoa(st.Limit)}, nil
}

func (c *Console) setLimit(w http.ResponseWriter, r *http.Request) {
	name, input := r.PostFormValue("name"), strings.TrimSpace(r.PostFormValue("limit"))
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	st, err := c.known(ctx, name)
	if err != nil {
		c.failWith(w, r, err)
		return
	}
	link := "/semaphore?" + url.Values{"name": {name}}.Encode()
	n, err := strconv.Atoi(input)
	if err == nil && n <= semaphore.MaxLimit && n > bigRaise*st.Limit && n-st.Limit > bigRaiseMin && r.PostFormValue("confirm") != strconv.Itoa(n) {
		v := c.view(r, "semaphore")
		v.Problem = fmt.Sprintf("Raise the limit of %s from %d to %d, %.0f× what it is? The permits protect the database: confirm below if you mean it. Nothing changed yet.",
			name, st.Limit, n, float64(n)/float64(st.Limit))
		if err := c.load(r, v, c.semaphoreData); err != nil {
			c.failWith(w, r, err)
			return
		}
		sv := v.Data.(semaphoreView)
		sv.Input, sv.Confirm = input, n
		v.Data = sv
		c.render(w, http.StatusOK, "semaphore", "layout", v)
		return
	}
	if err == nil && n >= 1 && n <= semaphore.MaxLimit {
		var s *semaphore.Semaphore
		if s, err = c.handle(name); err == nil {
			err = s.SetLimit(ctx, n)
		}
		if err != nil {
			c.failWith(w, r, err)
			return
		}
		c.log.Info("console: semaphore limit set", "semaphore", name, "limit", n)
		http.Redirect(w, r, withDone(link, "limit"), http.StatusSeeOther)
		return
	}
	v := c.view(r, "semaphore")
	v.Problem = fmt.Sprintf("The limit %q was refused: give a whole number from 1 to %d. Nothing changed.", input, semaphore.MaxLimit)
	if err := c.load(r, v, c.semaphoreData); err != nil {
		c.failWith(w, r, err)
		return
	}
	sv := v.Data.(semaphoreView)
	sv.Input = input
	v.Data = sv
	c.render(w, http.StatusBadRequest, "semaphore", "layout", v)
}
