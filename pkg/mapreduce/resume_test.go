package mapreduce_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// table is a keyset source that changes while a run splits it: sorted
// keys, each read and changed under a lock.
type table struct {
	mu   sync.Mutex
	keys []int
}

// newTable holds the keys 0, 10, 20, … of n rows.
func newTable(n int) *table {
	tb := &table{}
	for i := range n {
		tb.keys = append(tb.keys, 10*i)
	}
	return tb
}

// in returns the keys k with lo < k <= hi.
func (tb *table) in(lo, hi int) []int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []int
	for _, k := range tb.keys {
		if k > lo && k <= hi {
			out = append(out, k)
		}
	}
	return out
}

func (tb *table) delete(keys ...int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.keys = slices.DeleteFunc(tb.keys, func(k int) bool { return slices.Contains(keys, k) })
}

func (tb *table) insert(keys ...int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.keys = append(tb.keys, keys...)
	slices.Sort(tb.keys)
}

type keyRange struct{ Lo, Hi int }

// keysetSplit is a run over a table that changes between its split's
// first attempt and the next: when the split starts again, the first page's
// keys are deleted (so pages counted by position shift by one) and keys
// are inserted between and after the others.
type keysetSplit struct {
	tb     *table
	splits atomic.Int32
	mu     sync.Mutex
	seen   map[int]int // key → times a Map read it
}

func newKeysetSplit(rows int) *keysetSplit {
	s := &keysetSplit{tb: newTable(rows), seen: map[int]int{}}
	return s
}

// job returns the job; Split resumes from its cursor if resume is set.
func (s *keysetSplit) job(name string, resume bool, o mapreduce.JobOptions) mapreduce.Job[int, keyRange, int, int] {
	const pageSize = 2
	return mapreduce.Job[int, keyRange, int, int]{
		Name: name,
		Split: func(ctx context.Context, _ int, emit func(keyRange) error) error {
			if s.splits.Add(1) == 2 {
				first := s.tb.in(-1, 10)
				s.tb.delete(first...)
				var added []int
				for k := 5; k < 20_000; k += 40 {
					added = append(added, k)
				}
				s.tb.insert(added...)
				s.tb.insert(1_000_000, 1_000_010)
			}
			lo := -1
			if resume {
				if c, ok := mapreduce.ResumeSplit(ctx); ok {
					v, err := strconv.Atoi(c)
					if err != nil {
						return err
					}
					lo = v
				}
			}
			keys := s.tb.in(lo, 1<<62)
			for j := 0; j < len(keys); j += pageSize {
				hi := keys[min(j+pageSize, len(keys))-1]
				mapreduce.SetSplitCursor(ctx, strconv.Itoa(hi))
				if err := emit(keyRange{lo, hi}); err != nil {
					return err
				}
				lo = hi
			}
			return nil
		},
		Map: func(ctx context.Context, r keyRange) (int, error) {
			time.Sleep(5 * time.Millisecond)
			keys := s.tb.in(r.Lo, r.Hi)
			s.mu.Lock()
			for _, k := range keys {
				s.seen[k]++
			}
			s.mu.Unlock()
			return len(keys), nil
		},
		Options: o,
	}
}

// check counts the keys a Map read more than once, and the keys present
// throughout the run (those of start still in the table) that no Map read.
func (s *keysetSplit) check(start []int) (twice, missed []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.tb.in(-1, 1<<62)
	for k, n := range s.seen {
		if n > 1 {
			twice = append(twice, k)
		}
	}
	for _, k := range start {
		if slices.Contains(end, k) && s.seen[k] == 0 {
			missed = append(missed, k)
		}
	}
	slices.Sort(twice)
	return twice, missed
}

func TestASplitHandedOnOverAChangedTableResumesFromItsCursor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		resume bool
	}{
		{"from its cursor", true},
		{"by position", false}, // the control: shows the change would break a join
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			s := newKeysetSplit(1200)
			start := s.tb.in(-1, 1<<62)
			// 600 pages of 5 ms over 4 slots: ~0.75s, past half the split's 1s timeout.
			job := s.job("keyset", tc.resume, e.opts(mapreduce.JobOptions{Window: 50, SplitTimeout: time.Second}))
			e.addJob(mapreduce.AddJob(e.jobs, job))
			c := e.client()
			e.worker(c, 4)
			id, err := job.Start(context.Background(), c, 0, mapreduce.StartOptions{})
			if err != nil {
				t.Fatal(err)
			}
			st := wait(t, c, id, time.Minute)
			if st.State != mapreduce.StateSucceeded {
				t.Fatalf("run ended %s: %s", st.State, st.Error)
			}
			if n := s.splits.Load(); n < 2 {
				t.Fatalf("Split ran %d times: the split never handed on, so this test proves nothing", n)
			}
			twice, missed := s.check(start)
			switch {
			case tc.resume && len(twice)+len(missed) > 0:
				t.Errorf("keys read twice: %v; keys present throughout the run not read: %v", twice, missed)
			case !tc.resume && len(twice)+len(missed) == 0:
				t.Error("a split resumed by position over the changed table read every key once: the change does not move the pages, so the test above proves nothing")
			}
		})
	}
}

func TestASplitWhoseWorkerDiesBetweenFeedingAndEnqueuingLosesNoPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newKeysetSplit(1200)
	start := s.tb.in(-1, 1<<62)
	job := s.job("dies", true, e.opts(mapreduce.JobOptions{Window: 50}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	// The first attempt stores a feed of pages in the run, enqueues some of
	// them, and fails (as if killed) on page 300's enqueue: the next attempt
	// must enqueue the rest of that feed from what the run stored, and go on
	// after it.
	var failed atomic.Bool
	c.SetEnqueueFault(func(page int) error {
		if page == 300 && failed.CompareAndSwap(false, true) {
			return errors.New("the worker died")
		}
		return nil
	})
	e.worker(c, 4)
	id, err := job.Start(context.Background(), c, 0, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, time.Minute)
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("run ended %s: %s", st.State, st.Error)
	}
	if !failed.Load() || s.splits.Load() < 2 {
		t.Fatalf("enqueue fault fired: %v; Split ran %d times: the split never started again, so this test proves nothing", failed.Load(), s.splits.Load())
	}
	if twice, missed := s.check(start); len(twice)+len(missed) > 0 {
		t.Errorf("keys read twice: %v; keys present throughout the run not read: %v", twice, missed)
	}
}
