package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

type ctxKey int

const (
	runIDKey ctxKey = iota
	pageIndexKey
	loggerKey
	splitKey
)

// ExpectPages tells the run whose Split is running with ctx how many pages
// Split is going to emit, when it knows before it has emitted them all (a
// split that reads every page boundary first, as pgsource's does). With a
// window, a large run's split lasts most of the run, and its total is only
// written when the split ends; until then, Status.Expected lets the
// console and the command line show the run's progress and an ETA. It is
// a hint: the total that ends the run is what Split emitted. A Split that
// resumed from a cursor (ResumeSplit) counts only the pages it has still to
// emit; the run adds those fed before. Outside a Split, or when the run
// cannot be reached, it does nothing and returns the error.
func ExpectPages(ctx context.Context, n int) error {
	s, ok := ctx.Value(splitKey).(*splitState)
	if !ok {
		return errors.New("mapreduce: ExpectPages called outside a Split")
	}
	if n < 0 {
		return fmt.Errorf("mapreduce: ExpectPages(%d): want a number of pages, 0 or more", n)
	}
	s.mu.Lock()
	if s.resumed {
		n += s.base
	}
	s.mu.Unlock()
	return s.expect(ctx, n)
}

// ResumeSplit returns the cursor of the last page that an earlier attempt
// of this run's split fed to the run (SetSplitCursor), and true, when the
// split is starting again part-way: it was handed on to a new split task
// (a long run's split does so every half SplitTimeout), or its task is
// retried after an error or a worker crash. Call it at the start of Split,
// before emitting. A Split that gets true must go on after the cursor: the
// pages it emits then are numbered on from the pages already fed, and none
// of those is emitted again. So over a table that changes while the run
// lasts, a keyset split that resumes from the last key it fed neither
// reads a row twice nor misses one at the join (pgsource.Split does so).
//
// It returns "", false on a run's first split, when the last page fed had
// no cursor, after Retry (which splits from the start), and once Split has
// emitted a page that was not fed before. A Split that does not call it
// is run again from the start, and the pages fed before are skipped by
// position.
func ResumeSplit(ctx context.Context) (cursor string, ok bool) {
	return splitCursor(ctx, true)
}

// SplitCursor returns what ResumeSplit would, without resuming: for a
// Split that goes on from the cursor only if it is one of its own (one
// that pages several sources, as pgsource.Split may be called for
// several tables). Such a Split calls ResumeSplit once it knows.
func SplitCursor(ctx context.Context) (cursor string, ok bool) {
	return splitCursor(ctx, false)
}

func splitCursor(ctx context.Context, resume bool) (string, bool) {
	s, found := ctx.Value(splitKey).(*splitState)
	if !found {
		return "", false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Pages emitted so far that were all fed before (a Split over several
	// sources that ran one by position up to the one whose cursor this is)
	// do not stop it from resuming: the pages after the cursor follow them.
	if !s.has || s.resumed || s.next > s.base {
		return "", false
	}
	if resume {
		s.resumed, s.next = true, s.base
	}
	return s.cursor, true
}

// splitState is what a running Split reaches through its context:
// ExpectPages, ResumeSplit, SplitCursor and SetSplitCursor. It numbers the
// pages Split emits.
type splitState struct {
	expect func(ctx context.Context, n int) error // records the pages expected in all

	mu      sync.Mutex
	cursor  string // the cursor of the last page an earlier attempt fed
	has     bool   // there is one: the split may resume from it
	base    int    // pages fed before: a resumed Split's next page's index
	resumed bool   // Split called ResumeSplit and got the cursor
	next    int    // the index of the page Split emits next
	cursorN string // SetSplitCursor's cursor for the next page
}

// emitting is called for each page Split emits: it returns the page's
// index and cursor.
func (s *splitState) emitting() (i int, cursor string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, cursor, s.cursorN = s.next, s.cursorN, ""
	s.next++
	return i, cursor
}

// pages returns how many pages the run has: those fed before a resumed
// Split, and those Split emitted.
func (s *splitState) pages() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// SetSplitCursor sets the cursor of the page Split emits next: where a
// Split that resumes after that page goes on from (ResumeSplit), such as
// the page's last key. It applies to that one page; a page emitted without
// one has none, and a split interrupted after it starts again from the
// start. Keep it short: the run stores it with every batch of pages fed.
// Outside a Split it does nothing.
func SetSplitCursor(ctx context.Context, cursor string) {
	if s, ok := ctx.Value(splitKey).(*splitState); ok {
		s.mu.Lock()
		s.cursorN = cursor
		s.mu.Unlock()
	}
}

// RunID returns the ID of the run whose Split, Map or Reduce is running
// with ctx. Use it, with PageIndex, to make the effects of a Map idempotent:
// "run ID, page index" names one page's work across every retry.
func RunID(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(runIDKey).(string)
	return id, ok
}

// PageIndex returns the index of the page a Map is processing, from 0 in
// split order.
func PageIndex(ctx context.Context) (int, bool) {
	i, ok := ctx.Value(pageIndexKey).(int)
	return i, ok
}

// Logger returns the logger for code running with ctx; it is never nil.
// In a job's Split, Map or Reduce (and in what they call with their
// context, such as pgsource) it is the Client's logger (Config.Logger; in
// a worker, the worker's) with the step's attributes: run, job, step
// ("split", "map" or "reduce"), page (a Map's page index), attempt (1 for
// the first) and task (asynq's task ID), so that every line a step logs
// says which run, page and attempt it is about. Elsewhere it is the logger
// of ContextWithLogger, or slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey).(*slog.Logger); ok && l != nil {
		return l
	}
	return slog.Default()
}

// ContextWithLogger returns a copy of ctx whose Logger is l; a nil l
// leaves ctx as it is. A worker gives its tasks a context so; tests of a
// job's functions can do the same to capture what they log.
func ContextWithLogger(ctx context.Context, l *slog.Logger) context.Context {
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, loggerKey, l)
}
