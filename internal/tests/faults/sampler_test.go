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
			SELECT pid, coalesce(query_start, now()) FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'active'`, app)
		var qs []query
		if err == nil {
			var q query
			_, err = pgx.ForEachRow(rows, []any{&q.pid, &q.start}, func() error {
				qs = append(qs, q)
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

func (s *sampler) record(at time.Time, qs []query) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
