// Package outage turns the failures an outage causes into a few log
// lines: one warning when a cause starts, with its first error; each
// later failure at debug; a reminder once a minute while it lasts; and
// one line when it ends, saying how long it lasted and how many attempts
// failed for it. A 60 s database outage is then two lines per worker,
// not one per page and retry.
//
//	o := outage.New(log, "mapreduce")
//	if cause := classify(err); cause != "" {
//		o.Failed(stepLog, cause, job, err) // a warning the first time
//	}
//	...
//	o.Ended(outage.Database, job) // after a step of job succeeds
package outage

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Cause is what an outage is of: the failures of one cause are one outage.
type Cause string

// The causes batchmr's packages recognise.
const (
	// Database: Postgres refuses or drops connections, or is shutting
	// down or starting.
	Database Cause = "database unreachable"
	// Redis: Redis refuses or drops connections, or does not answer.
	Redis Cause = "Redis unreachable"
	// RedisFailover: Redis answers but cannot serve yet: a demoted or
	// loading server, a cluster or Sentinel switching primaries
	// (READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN).
	RedisFailover Cause = "Redis failing over"
)

// RemindEvery is how often a Log repeats, at warn, that an outage goes
// on, so that one that never ends is not silent.
const RemindEvery = time.Minute

// Settle is how long after an outage ends a failure of its cause is
// taken for a straggler of it (an attempt that began before the end and
// failed after it) and logged at debug, not as a new outage: failures
// that go on past it start one.
const Settle = 5 * time.Second

// Log logs outages. Its methods may be called from many goroutines. The
// zero value is not usable: use New.
type Log struct {
	log    *slog.Logger
	prefix string
	now    func() time.Time

	ongoing atomic.Int32 // len(spells), read without the lock
	mu      sync.Mutex
	spells  map[Cause]*spell
	ended   map[Cause]time.Time // when each cause's last outage ended
}

// spell is one outage of a cause, while it lasts.
type spell struct {
	began    time.Time
	reminded time.Time // when it was last logged at warn
	failures int
	last     time.Time       // its last failure
	scopes   map[string]bool // what failed for it, for Ended
}

// New returns a Log that logs its start, reminder and end lines to log,
// each message beginning with prefix ("mapreduce", "worker").
func New(log *slog.Logger, prefix string) *Log {
	return NewWithClock(log, prefix, time.Now)
}

// NewWithClock is New with now for the clock, for tests.
func NewWithClock(log *slog.Logger, prefix string, now func() time.Time) *Log {
	return &Log{log: log, prefix: prefix, now: now, spells: map[Cause]*spell{}, ended: map[Cause]time.Time{}}
}

// Failed records an attempt that failed with err for cause, done by
// scope (a job's name, a component: what Ended needs to see succeed).
// The first failure of an outage of cause is logged at warn, with err and
// attrs, through l (nil: the Log's logger), and so is a reminder once
// RemindEvery has passed since the last; the others at debug, as are
// failures within Settle of the end of the cause's last outage. An
// outage with no failure for RemindEvery, which nothing here was seen to
// end, is taken to have ended at its last failure: the next failure
// logs that end, and starts a new outage.
func (o *Log) Failed(l *slog.Logger, cause Cause, scope string, err error, attrs ...slog.Attr) {
	if l == nil {
		l = o.log
	}
	now := o.now()
	o.mu.Lock()
	s := o.spells[cause]
	var stale *spell
	if s != nil && now.Sub(s.last) >= RemindEvery {
		// Nothing failed for it for a minute, and nothing that did
		// succeeded here since (its job's steps went to other workers):
		// it was over. This failure is a new outage's.
		stale, s = s, nil
		delete(o.spells, cause)
	}
	if s == nil && stale == nil && now.Sub(o.ended[cause]) < Settle {
		o.mu.Unlock()
		attrs = append(attrs, slog.String("cause", string(cause)), slog.Any("error", err))
		l.LogAttrs(context.Background(), slog.LevelDebug, o.prefix+": failed as an outage ended: "+string(cause), attrs...)
		return
	}
	first := s == nil
	if first {
		s = &spell{began: now, reminded: now, scopes: map[string]bool{}}
		o.spells[cause] = s
		o.ongoing.Store(int32(len(o.spells)))
	}
	s.failures++
	s.last = now
	s.scopes[scope] = true
	remind := !first && now.Sub(s.reminded) >= RemindEvery
	if remind {
		s.reminded = now
	}
	began, failures := s.began, s.failures
	o.mu.Unlock()

	if stale != nil {
		o.logEnd(cause, stale, stale.last)
	}
	attrs = append(attrs, slog.String("cause", string(cause)), slog.Any("error", err))
	switch {
	case first:
		l.LogAttrs(context.Background(), slog.LevelWarn, o.prefix+": "+string(cause)+": retrying; until it ends its failures are logged at debug", attrs...)
	case remind:
		attrs = append(attrs, slog.Duration("for", now.Sub(began).Round(time.Millisecond)), slog.Int("failures", failures))
		l.LogAttrs(context.Background(), slog.LevelWarn, o.prefix+": "+string(cause)+" still: retrying", attrs...)
	default:
		l.LogAttrs(context.Background(), slog.LevelDebug, o.prefix+": failed during an outage: "+string(cause), attrs...)
	}
}

// Ended ends the outage of cause, if there is one and scope is "" or
// failed for it, logging at info how long it lasted (from its first
// failure) and how many attempts failed for it. A caller calls it when
// something that failed for cause succeeds: it costs an atomic load while
// no outage lasts.
func (o *Log) Ended(cause Cause, scope string) {
	if o.ongoing.Load() == 0 {
		return
	}
	now := o.now()
	o.mu.Lock()
	s := o.spells[cause]
	if s == nil || (scope != "" && !s.scopes[scope]) {
		o.mu.Unlock()
		return
	}
	delete(o.spells, cause)
	o.ended[cause] = now
	o.ongoing.Store(int32(len(o.spells)))
	o.mu.Unlock()
	o.logEnd(cause, s, now)
}

// logEnd logs that the outage s of cause ended at end.
func (o *Log) logEnd(cause Cause, s *spell, end time.Time) {
	o.log.LogAttrs(context.Background(), slog.LevelInfo, o.prefix+": "+string(cause)+": over",
		slog.String("cause", string(cause)), slog.Duration("lasted", end.Sub(s.began).Round(time.Millisecond)), slog.Int("failures", s.failures))
}

// EndedAll ends every outage that scope failed for, as Ended does for
// each cause.
func (o *Log) EndedAll(scope string) {
	if o.ongoing.Load() == 0 {
		return
	}
	o.mu.Lock()
	causes := make([]Cause, 0, len(o.spells))
	for c := range o.spells {
		causes = append(causes, c)
	}
	o.mu.Unlock()
	for _, c := range causes {
		o.Ended(c, scope)
	}
}

// Ongoing reports whether an outage of any cause lasts.
func (o *Log) Ongoing() bool { return o.ongoing.Load() > 0 }
