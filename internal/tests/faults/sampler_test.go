//go:build linux

package faults_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// sampleEvery is how often the sampler reads pg_stat_activity: shorter
// than a page's query (20 ms), so that it sees every one. Where permits
// change hands in a burst — a cancel, the end of a fault — a query run
// without a permit may overlap the others by a few milliseconds only, so
// there it samples every sampleCloselyEvery (a sample costs ~0.5 ms of
// CPU, too much to spend all the time).
const (
	sampleEvery        = 10 * time.Millisecond
	sampleCloselyEvery = time.Millisecond
)

// sampler counts, every sampleEvery on a connection of its own, the worker
// queries Postgres is running: what the database really sees, whatever the
// workers believe about their permits. It rides out database outages,
// reconnecting as soon as the server is back.
type sampler struct {
	mu         sync.Mutex
	max        int       // most worker queries active at once
	maxAt      time.Time // when max was first seen
	active     int       // active worker queries in the latest sample
	sampledAt  time.Time // when the latest sample was taken
	lastActive time.Time // the latest sample that saw a worker query
	lastSeen   []query   // the worker queries that sample saw
	starts     map[query]struct{}
	counts     []count   // every sample's count, in order
	failed     int       // samples that failed (the server was away)
	closely    time.Time // until when to sample every sampleCloselyEvery

	// The first sample that saw more than limit worker queries, in
	// detail: its backends, those of the sample after it (a query seen
	// in both ran), and what explain (if set) said then.
	limit     int
	explain   func() string
	overAt    time.Time
	overSeen  []backend
	overNext  []backend
	overNote  string
	nextTaken bool

	stop chan struct{}
	done chan struct{}
}

// count is how many worker queries one sample saw, and when.
type count struct {
	at time.Time
	n  int
}

// query is one worker query: the backend that ran it and when it started.
type query struct {
	pid   int32
	start time.Time
}

// backend is what pg_stat_activity showed of one active worker backend.
type backend struct {
	query
	backendStart time.Time
	state        string
	waitEvent    string // type:event, or empty when it waits on nothing
	sql          string // the query's first 80 characters
}

// startSampler samples the queries of application app on the server at
// url until the test ends.
func startSampler(t *testing.T, url, app string) *sampler {
	s := &sampler{starts: map[query]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run(url+"&application_name=faults-sampler", app)
	t.Cleanup(func() {
		close(s.stop)
		<-s.done
	})
	return s
}

func (s *sampler) run(url, app string) {
	defer close(s.done)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for {
		every := sampleEvery
		s.mu.Lock()
		if time.Now().Before(s.closely) {
			every = sampleCloselyEvery
		}
		s.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-time.After(every):
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if conn == nil {
			var err error
			if conn, err = pgx.Connect(ctx, url); err != nil {
				conn = nil
				cancel()
				s.fail()
				continue
			}
		}
		rows, err := conn.Query(ctx, `
			SELECT pid, coalesce(query_start, now()), coalesce(backend_start, now()), state,
				coalesce(wait_event_type || ':' || wait_event, ''), left(query, 80)
			FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'active'`, app)
		var qs []backend
		if err == nil {
			var b backend
			_, err = pgx.ForEachRow(rows, []any{&b.pid, &b.start, &b.backendStart, &b.state, &b.waitEvent, &b.sql}, func() error {
				qs = append(qs, b)
				return nil
			})
		}
		cancel()
		if err != nil {
			_ = conn.Close(context.Background())
			conn = nil
			s.fail()
			continue
		}
		s.record(time.Now(), qs)
	}
}

func (s *sampler) fail() {
	s.mu.Lock()
	s.failed++
	s.mu.Unlock()
}

func (s *sampler) record(at time.Time, bs []backend) {
	qs := make([]query, len(bs))
	for i, b := range bs {
		qs[i] = b.query
	}
	s.mu.Lock()
	s.active, s.sampledAt = len(qs), at
	s.counts = append(s.counts, count{at, len(qs)})
	if len(qs) > s.max {
		s.max, s.maxAt = len(qs), at
	}
	if len(qs) > 0 {
		s.lastActive, s.lastSeen = at, qs
	}
	for _, q := range qs {
		s.starts[q] = struct{}{}
	}
	if !s.overAt.IsZero() && !s.nextTaken {
		s.overNext, s.nextTaken = bs, true
	}
	first := s.limit > 0 && len(bs) > s.limit && s.overAt.IsZero()
	if first {
		s.overAt, s.overSeen = at, bs
	}
	explain := s.explain
	s.mu.Unlock()
	if first && explain != nil {
		note := explain()
		s.mu.Lock()
		s.overNote = note
		s.mu.Unlock()
	}
}

// explainOver makes the sampler keep in detail the first sample that sees
// more than limit worker queries, and the one after it, and call explain
// right then, for overDetail to show.
func (s *sampler) explainOver(limit int, explain func() string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit, s.explain = limit, explain
}

// overDetail describes the first sample that saw more worker queries than
// the limit of explainOver: each backend's pid, when it started and its
// query did (relative to the sample), its state, wait event and query;
// whether the next sample still saw that query; and what explain said.
func (s *sampler) overDetail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overAt.IsZero() {
		return "no sample saw more worker queries than the limit"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the first sample over the limit, at %s, saw:", s.overAt.Format("15:04:05.000"))
	for _, q := range s.overSeen {
		next := "not in the next sample"
		switch {
		case !s.nextTaken:
			next = "no next sample"
		case slices.ContainsFunc(s.overNext, func(n backend) bool { return n.query == q.query }):
			next = "still active in the next sample"
		}
		fmt.Fprintf(&b, "\n  pid %d: backend started %v, query %v, state %s, wait %q, %s: %q", q.pid,
			q.backendStart.Sub(s.overAt).Round(time.Millisecond), q.start.Sub(s.overAt).Round(time.Millisecond),
			q.state, q.waitEvent, next, strings.Join(strings.Fields(q.sql), " "))
	}
	if s.nextTaken {
		fmt.Fprintf(&b, "\nthe next sample saw %d", len(s.overNext))
	}
	if s.overNote != "" {
		fmt.Fprintf(&b, "\nthen: %s", s.overNote)
	}
	return b.String()
}

// watchClosely makes the sampler sample every sampleCloselyEvery for d.
func (s *sampler) watchClosely(d time.Duration) {
	s.mu.Lock()
	s.closely = time.Now().Add(d)
	s.mu.Unlock()
}

// maximum returns the most worker queries seen at once, and when.
func (s *sampler) maximum() (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.maxAt
}

// latest returns the latest sample: the worker queries active, when it was
// taken, and when a sample last saw one.
func (s *sampler) latest() (active int, at, lastActive time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active, s.sampledAt, s.lastActive
}

// lastSeenQueries describes the worker queries of the latest sample that
// saw any: each one's backend and when it started, relative to t. A test
// that finds a query outliving a cancel says with it whether the query
// started before the cancel (it was not cancelled) or after (it began
// late).
func (s *sampler) lastSeenQueries(t time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := make([]string, len(s.lastSeen))
	for i, q := range s.lastSeen {
		parts[i] = fmt.Sprintf("pid %d started %+v", q.pid, q.start.Sub(t).Round(time.Millisecond))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// firstStartAfter returns when the first worker query seen that started at
// or after t started.
func (s *sampler) firstStartAfter(t time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var after []time.Time
	for q := range s.starts {
		if !q.start.Before(t) {
			after = append(after, q.start)
		}
	}
	if len(after) == 0 {
		return time.Time{}, false
	}
	return slices.MinFunc(after, func(a, b time.Time) int { return a.Compare(b) }), true
}

// startsBetween counts the worker queries seen that started in [from, to).
func (s *sampler) startsBetween(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for q := range s.starts {
		if !q.start.Before(from) && q.start.Before(to) {
			n++
		}
	}
	return n
}

// over measures, from from on, the samples that saw more than limit worker
// queries: how many, for how long in all (each such sample counts until
// the next sample), and when the first was taken.
func (s *sampler) over(limit int, from time.Time) (samples int, d time.Duration, first time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.counts {
		if c.at.Before(from) || c.n <= limit {
			continue
		}
		if samples == 0 {
			first = c.at
		}
		samples++
		if i+1 < len(s.counts) {
			d += s.counts[i+1].at.Sub(c.at)
		}
	}
	return samples, d, first
}
