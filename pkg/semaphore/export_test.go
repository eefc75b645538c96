package semaphore

import (
	"context"
	"os"
	"time"
)

func init() {
	forceEval = os.Getenv("BATCHMR_SEMAPHORE_SCRIPTS") == "eval"
}

// ScriptID names one script both ways a client may call it, so that tests
// can inject faults into that script's calls.
type ScriptID struct{ Hash, Function string }

var (
	AcquireScript = ScriptID{scriptAcquire.eval.Hash(), defaultLibrary.functions[scriptAcquire]}
	ReleaseScript = ScriptID{scriptRelease.eval.Hash(), defaultLibrary.functions[scriptRelease]}
	CarryScript   = ScriptID{scriptCarry.eval.Hash(), defaultLibrary.functions[scriptCarry]}
	RefreshScript = ScriptID{scriptRefresh.eval.Hash(), defaultLibrary.functions[scriptRefresh]}
	StatsScript   = ScriptID{scriptStats.eval.Hash(), defaultLibrary.functions[scriptStats]}
)

// ForcedEval reports whether the suite runs with EVALSHA only.
func ForcedEval() bool { return forceEval }

// UsesFunctions reports whether s runs its scripts as functions.
func (s *Semaphore) UsesFunctions() bool {
	return s.scriptMode.Load() == modeFunctions && s.functionsAfter.Load() == 0
}

// UseOwnLibrary gives s a function library of its own, named after version,
// so that a test may delete it or be refused it without touching the
// library every other test (and test binary) on the server uses. Call it
// before s makes any call. It returns the library's name.
func (s *Semaphore) UseOwnLibrary(version string) string {
	s.lib = newLibrary(version)
	return s.lib.name
}

// ReleaseTimeout bounds the handle's own Redis calls.
const ReleaseTimeout = releaseTimeout

// Pending is the number of waiters waiting for a call to carry their first
// request (enqueue.go).
func (s *Semaphore) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Handoffs is the number of this handle's releases that Redis passed
// straight to the queue's head (handoff in scripts/lib.lua).
func (s *Semaphore) Handoffs() uint64 { return s.handoffs.Load() }

// SetLimitInRedis runs the set-limit script with limit as given, past
// SetLimit's own checks, so that a test can prove the script's.
func (s *Semaphore) SetLimitInRedis(ctx context.Context, limit string) error {
	_, err := s.eval(ctx, scriptSetLimit, limit)
	return err
}

// ConfigureLimit sets the limit s writes to Redis when Redis has none, past
// New's checks, so that a test can prove the scripts'.
func (s *Semaphore) ConfigureLimit(n int) { s.opts.Limit = n }

// ErrNotAuto is adapt's error outside auto and shadow mode.
var ErrNotAuto = errNotAuto

// SetAdaptive takes the controller's lease for this process, a minute
// long (in auto or shadow mode: in fixed mode nobody does), and moves N as
// the controller does (adapt), for tests of auto mode without a
// controller's timing.
func (s *Semaphore) SetAdaptive(ctx context.Context, n int, hold time.Duration, reason string) (int, error) {
	res, err := s.eval(ctx, scriptControl, s.process, time.Minute.Milliseconds())
	if err != nil {
		return 0, err
	}
	vals, _ := res.([]any)
	lease := "" // not the controller: adapt says why it refuses
	if lead, _ := vals[1].(int64); lead == 1 {
		lease, _ = vals[0].(string)
	}
	return s.adapt(ctx, lease, n, hold, reason, "")
}

// AdaptAs moves N as a controller whose lease value is lease would.
func (s *Semaphore) AdaptAs(ctx context.Context, lease string, n int) (int, error) {
	return s.adapt(ctx, lease, n, time.Minute, "test", "")
}
