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
//
// Postgres reads pg_stat_activity a backend at a time, not at one instant:
// a reader held up mid-read (preempted, or waiting on a backend that is
// updating its entry) lists backends read before the wait as they were
// then, and those after as they are later, so that a query that ended in
// between shows beside the one that took its permit. A sample therefore
// counts only the queries that had started when its statement did
// (query_start <= statement_timestamp()): each was still active when read,
// later, so all of them ran at that instant. A query listed that started
// during the read is kept for everything else (when work resumed, what a
// cancel left running), and shows in the sample's detail.
type sampler struct {
	mu         sync.Mutex
	max        int       // most worker queries active at once (at a sample's start)
	maxAt      time.Time // when max was first seen
	active     int       // active worker queries the latest sample listed
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
	// The samples that listed more than limit worker queries, but fewer
	// that had started when the sample did, and the first of them.
	spread     int
	spreadAt   time.Time
	spreadSeen []backend

	stop chan struct{}
	done chan struct{}
}

// count is how many worker queries ran at the start of one sample, and
// when it was taken.
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
	// The sample's statement began at asked, and Postgres read
	// pg_stat_activity between then and read (when it returned the row).
	asked, read time.Time
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
				coalesce(wait_event_type || ':' || wait_event, ''), left(query, 80),
				statement_timestamp(), clock_timestamp()
			FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'active'`, app)
		var qs []backend
		if err == nil {
			var b backend
			_, err = pgx.ForEachRow(rows, []any{&b.pid, &b.start, &b.backendStart, &b.state, &b.waitEvent, &b.sql, &b.asked, &b.read}, func() error {
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
	at0 := 0 // the queries that ran at the sample's start
	for i, b := range bs {
		qs[i] = b.query
		if !b.start.After(b.asked) {
			at0++
		}
	}
	s.mu.Lock()
	s.active, s.sampledAt = len(qs), at
	s.counts = append(s.counts, count{at, at0})
	if at0 > s.max {
		s.max, s.maxAt = at0, at
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
	first := s.limit > 0 && at0 > s.limit && s.overAt.IsZero()
	if first {
		s.overAt, s.overSeen = at, bs
	}
	if s.limit > 0 && len(bs) > s.limit && at0 <= s.limit {
		if s.spread == 0 {
			s.spreadAt, s.spreadSeen = at, bs
		}
		s.spread++
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

// overDetail describes the first sample that saw more worker queries
// than the limit of explainOver (see describeSample), and what explain
// said then.
func (s *sampler) overDetail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overAt.IsZero() {
		return "no sample saw more worker queries than the limit"
	}
	d := "the first sample over the limit, " + describeSample(s.overAt, s.overSeen, s.overNext, s.nextTaken)
	if s.overNote != "" {
		d += "\nthen: " + s.overNote
	}
	return d
}

// spreadDetail says how many samples listed more worker queries than the
// limit of explainOver but had fewer running when they began, and
// describes the first; "" if none did.
func (s *sampler) spreadDetail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spread == 0 {
		return ""
	}
	return fmt.Sprintf("%d samples listed more worker queries than the limit, but no more ran at once: the rest began after the sample did, "+
		"while Postgres read pg_stat_activity a backend at a time; the first such ", s.spread) + describeSample(s.spreadAt, s.spreadSeen, nil, false)
}

// describeSample describes the sample taken at at that saw bs: for each
// backend its pid, when it and its query started (relative to the start
// of the sample's statement), its state, wait event and query, and
// whether the next sample (next, if taken) still saw that query.
func describeSample(at time.Time, bs, next []backend, nextTaken bool) string {
	var b strings.Builder
	t0 := bs[0].asked
	fmt.Fprintf(&b, "at %s, began at %s and saw %d (Postgres returned them %v after it began; times below relative to its start):",
		at.Format("15:04:05.000"), t0.Format("15:04:05.000000"), len(bs), bs[0].read.Sub(t0).Round(10*time.Microsecond))
	for _, q := range bs {
		seen := "not in the next sample"
		switch {
		case !nextTaken:
			seen = "no next sample"
		case slices.ContainsFunc(next, func(n backend) bool { return n.query == q.query }):
			seen = "still active in the next sample"
		}
		fmt.Fprintf(&b, "\n  pid %d: backend started %v, query %v, state %s, wait %q, %s: %q", q.pid,
			q.backendStart.Sub(t0).Round(time.Millisecond), q.start.Sub(t0).Round(10*time.Microsecond),
			q.state, q.waitEvent, seen, strings.Join(strings.Fields(q.sql), " "))
	}
	if nextTaken {
		fmt.Fprintf(&b, "\nthe next sample saw %d", len(next))
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

// A sample counts the worker queries that ran when it began, all at once,
// not those that pg_stat_activity lists beside them but that started
// while Postgres read it: those may have taken the permit of one listed
// that ended meanwhile.
func TestASampleCountsTheQueriesRunningWhenItBeganNotThoseStartedWhilePostgresReadIt(t *testing.T) {
	s := &sampler{starts: map[query]struct{}{}}
	s.explainOver(3, nil)
	t0 := time.Now()
	sample := func(at time.Time, starts ...time.Duration) []backend {
		var bs []backend
		for i, d := range starts {
			bs = append(bs, backend{query: query{pid: int32(100 + i), start: at.Add(d)}, state: "active", asked: at, read: at.Add(5 * time.Millisecond)})
		}
		return bs
	}
	// Three ran when the sample began; two more started during its read.
	s.record(t0, sample(t0, -10*time.Millisecond, -8*time.Millisecond, -time.Millisecond, time.Millisecond, 2*time.Millisecond))
	if most, _ := s.maximum(); most != 3 {
		t.Errorf("a sample listing 3 queries that ran when it began and 2 that started during its read counts %d, want 3", most)
	}
	if d := s.spreadDetail(); !strings.Contains(d, "1 samples listed more") {
		t.Errorf("the sample listing more than the limit is not reported: %q", d)
	}
	// Four ran at once when the sample began: over the limit.
	t1 := t0.Add(10 * time.Millisecond)
	s.record(t1, sample(t1, -5*time.Millisecond, -4*time.Millisecond, -3*time.Millisecond, 0))
	if most, at := s.maximum(); most != 4 || !at.Equal(t1) {
		t.Errorf("a sample of 4 queries all running when it began counts %d at %v, want 4 at %v", most, at, t1)
	}
	if n, _, first := s.over(3, t0); n != 1 || !first.Equal(t1) {
		t.Errorf("over(3): %d samples, the first at %v; want 1 at %v", n, first, t1)
	}
	if d := s.overDetail(); !strings.Contains(d, "pid 103") {
		t.Errorf("the detail of the sample over the limit does not list its queries: %q", d)
	}
}
