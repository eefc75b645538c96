package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pageQuery is the page's work: CPU in Postgres and nothing else. The
// set-returning function in the select list streams its rows (no
// tuplestore, no temporary file), so its time is the backend's CPU.
const pageQuery = "SELECT count(*) FROM (SELECT generate_series(1, $1::bigint)) s"

// A done is one finished query: when it ended, how long it ran from the
// grant of its permit to its end (service time, not waiting time), and
// whether it failed.
type done struct {
	at      time.Time
	latency time.Duration
	failed  bool
}

// load runs goroutines that each loop: acquire a permit, run the page
// query on the pool, report how it ended, release.
type load struct {
	sem     *semaphore.Semaphore
	pool    *pgxpool.Pool
	rows    int64
	timeout time.Duration // per query; 0: none

	mu      sync.Mutex
	dones   []done
	errs    map[string]int // errors other than the run's own end, by text
	nextID  int64
	running map[int64]time.Time // the queries running now, by when their permits were granted
}

// run starts g goroutines and returns when ctx is done and they have
// stopped.
func (l *load) run(ctx context.Context, g int) {
	var wg sync.WaitGroup
	for range g {
		wg.Go(func() {
			for ctx.Err() == nil {
				l.one(ctx)
			}
		})
	}
	wg.Wait()
}

func (l *load) one(ctx context.Context) {
	p, err := l.sem.Acquire(ctx)
	if err != nil {
		if ctx.Err() == nil {
			l.fail(err)
			time.Sleep(10 * time.Millisecond)
		}
		return
	}
	start := time.Now()
	l.mu.Lock()
	if l.running == nil {
		l.running = map[int64]time.Time{}
	}
	l.nextID++
	id := l.nextID
	l.running[id] = start
	l.mu.Unlock()
	qctx, cancel := p.Context(), context.CancelFunc(func() {})
	if l.timeout > 0 {
		qctx, cancel = context.WithTimeout(qctx, l.timeout)
	}
	var n int64
	err = l.pool.QueryRow(qctx, pageQuery, l.rows).Scan(&n)
	cancel()
	end := time.Now()
	p.Report(err)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = p.Release(rctx)
	rcancel()
	// A query the run's end cancelled is neither a completion nor a failure.
	canceled := err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled)
	l.mu.Lock()
	delete(l.running, id)
	if !canceled {
		l.dones = append(l.dones, done{at: end, latency: end.Sub(start), failed: err != nil})
	}
	l.mu.Unlock()
	if err != nil && !canceled {
		l.fail(err)
	}
}

// waitBegunBefore waits until every query granted before t has ended.
func (l *load) waitBegunBefore(ctx context.Context, t time.Time) error {
	for {
		l.mu.Lock()
		busy := false
		for _, s := range l.running {
			if s.Before(t) {
				busy = true
				break
			}
		}
		l.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (l *load) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errs == nil {
		l.errs = map[string]int{}
	}
	l.errs[err.Error()]++
}

// window is what the load did in [from, to): its completed queries per
// second, their latency percentiles, and its failures.
type window struct {
	from, to   time.Time
	completed  int
	failed     int
	throughput float64 // completed queries per second
	p50, p99   time.Duration
	// The cores Postgres used on average, and those the machine's other
	// processes (but Redis and this one) did: load beside the run.
	pgCores, otherCores float64
}

func (l *load) window(from, to time.Time) window {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := window{from: from, to: to}
	var lat []time.Duration
	for _, d := range l.dones {
		if d.at.Before(from) || !d.at.Before(to) {
			continue
		}
		if d.failed {
			w.failed++
			continue
		}
		w.completed++
		lat = append(lat, d.latency)
	}
	w.throughput = float64(w.completed) / to.Sub(from).Seconds()
	w.p50, w.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return w
}

// errors returns the failures seen so far, by text, and forgets them.
func (l *load) takeErrors() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.errs
	l.errs = nil
	return e
}

// percentile returns the q-quantile of xs (nearest rank), 0 for none.
func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// printErrors prints the failures since the last take, if any, as those
// of during.
func (l *load) printErrors(during string) {
	if e := l.takeErrors(); len(e) > 0 {
		fmt.Printf("Failures during %s: %v\n\n", during, e)
	}
}
