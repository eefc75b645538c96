package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Mode says who sets a semaphore's limit.
type Mode string

const (
	// ModeFixed: the operator alone, with SetLimit.
	ModeFixed Mode = "fixed"
	// ModeAuto: the controller (RunController), within the operator's
	// bounds; each N it sets holds for the time it gives, then the limit
	// falls back to the operator's fixed N.
	ModeAuto Mode = "auto"
	// ModeShadow: the controller's N is recorded, never applied; the limit
	// stays the operator's fixed N.
	ModeShadow Mode = "shadow"
)

var (
	// errNotAuto: the semaphore is in neither auto nor shadow mode.
	errNotAuto = errors.New("not in auto mode")
	// errNotController: the caller's lease ran out, or another took over.
	errNotController = errors.New("not the controller: its lease ran out or another process took over")
)

// maxReason bounds the controller's reason as Redis keeps it: every
// script call reads it.
const maxReason = 200

// AutoLimits are the operator's settings for auto mode (SetAuto).
type AutoLimits struct {
	// Min and Max bound the limit: 1 <= Min <= Max <= MaxLimit.
	Min, Max int
	// Fixed is the operator's N: the limit until a controller moves it,
	// and again whenever the controller's N stops holding. 0 keeps the
	// operator's N as it stands (the fixed N of the auto mode in force,
	// else the limit in Redis, else Options.Limit), clamped into
	// [Min, Max]; a Fixed given must lie within them.
	Fixed int
	// Shadow records the controller's N without applying it.
	Shadow bool
	// Window is how often the controller decides, for the whole fleet:
	// several times a typical permit's hold, so that a window sees a few
	// releases (from MinWindow to MaxWindow; 0 keeps the one set before,
	// else each controller's ControllerOptions.Window, 1s by default).
	Window time.Duration
}

// The bounds of AutoLimits.Window.
const (
	MinWindow = 100 * time.Millisecond
	MaxWindow = 10 * time.Minute
)

// AutoState is a semaphore's mode as Redis holds it (Stats.Auto).
type AutoState struct {
	Mode            Mode
	Min, Max, Fixed int // the operator's bounds and N; 0 in ModeFixed
	// Controller is the controller's last N, clamped into [Min, Max]
	// (0: none yet), and Reason what it gave for it.
	Controller int
	Reason     string
	// HoldLeft is how long the controller's N holds still; 0 when the
	// limit is the fixed N.
	HoldLeft time.Duration
	// Why the limit last moved, MovedAgo ago: "operator" (SetAuto),
	// "controller" (RunController) or "fallback" (the controller's N
	// stopped holding).
	Why      string
	MovedAgo time.Duration
	// Window is the operator's AutoLimits.Window (0: none set).
	Window time.Duration
	// Signals are what the controller read in its last window.
	Signals ControllerSignals
}

// SetAuto puts the semaphore in auto mode (or shadow mode, with
// a.Shadow) for every process at once: from then on a controller sets the
// limit within [a.Min, a.Max] (RunController), and the limit is the fixed N
// (see AutoLimits.Fixed) until it does and whenever its N stops holding.
// In auto mode a request is refused as too heavy only above a.Max, not
// above the limit: a queued request that fits under a.Max waits until the
// limit lets it in. SetAuto fails, at once, the queued requests that can
// never be granted (heavier than a.Max; in shadow mode, than the limit).
// SetLimit ends auto mode. Bad input is an error naming the fix, and
// changes nothing. Replicas are waited for as by SetLimit.
func (s *Semaphore) SetAuto(ctx context.Context, a AutoLimits) error {
	switch {
	case a.Min < 1:
		return fmt.Errorf("semaphore %q: set auto: min %d: the limit's lower bound must be at least 1", s.name, a.Min)
	case a.Max > MaxLimit:
		return fmt.Errorf("semaphore %q: set auto: max %d: the limit's upper bound must be at most %d (MaxLimit)", s.name, a.Max, MaxLimit)
	case a.Max < a.Min:
		return fmt.Errorf("semaphore %q: set auto: max %d is below min %d: give a max of at least the min", s.name, a.Max, a.Min)
	case a.Fixed != 0 && (a.Fixed < a.Min || a.Fixed > a.Max):
		return fmt.Errorf("semaphore %q: set auto: fixed %d is outside [%d, %d]: give a fixed N within the bounds, or 0 to keep the limit as it stands", s.name, a.Fixed, a.Min, a.Max)
	case a.Window != 0 && (a.Window < MinWindow || a.Window > MaxWindow):
		return fmt.Errorf("semaphore %q: set auto: window %v: give one from %v to %v, several times a typical permit's hold, or 0 to keep it", s.name, a.Window, MinWindow, MaxWindow)
	}
	mode := ModeAuto
	if a.Shadow {
		mode = ModeShadow
	}
	_, err := s.evalReplicated(ctx, "set auto", scriptSetAuto, string(mode), a.Min, a.Max, a.Fixed, a.Window.Milliseconds())
	return err
}

// Mode reads who sets the limit now: one GET, cheap enough to watch
// (Stats has the mode's bounds, its controller's last N and why).
func (s *Semaphore) Mode(ctx context.Context) (Mode, error) {
	rec, err := s.rdb.Get(ctx, s.keys[8]).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("semaphore %q: mode: %w", s.name, err)
	}
	return parseAuto(rec, 0).Mode, nil
}

// adapt is the controller's call (RunController): in auto mode it sets
// the limit to n clamped into the operator's [Min, Max], for every process
// at once, and returns the limit it set. n holds for hold (Redis time); if
// no other adapt comes before that has passed, the next call of any
// process sets the limit back to the operator's fixed N. A raised limit
// grants waiters at once; a lowered one lets holders finish, grants nobody
// until what is held fits, and fails no queued request. In shadow mode it
// only records n (clamped) and reason, and returns the limit unchanged.
// reason is kept to 200 bytes; signals (JSON of ControllerSignals) are
// recorded as they are. It is refused unless lease is still the
// controller's (control.lua), and outside both modes with errNotAuto,
// changing nothing. Replicas are waited for as by SetLimit.
func (s *Semaphore) adapt(ctx context.Context, lease string, n int, hold time.Duration, reason, signals string) (int, error) {
	if hold < time.Millisecond {
		return 0, fmt.Errorf("semaphore %q: set adaptive: hold %v: N must hold for 1ms or more (a controller's window, or a few)", s.name, hold)
	}
	n = min(max(n, 1), MaxLimit) // and then into [Min, Max], in Redis
	if len(reason) > maxReason {
		reason = strings.ToValidUTF8(reason[:maxReason], "")
	}
	res, err := s.evalReplicated(ctx, "set adaptive", scriptAdapt, n, hold.Milliseconds(), reason, lease, signals)
	if err != nil {
		switch {
		case strings.Contains(err.Error(), "not in auto mode"):
			return 0, fmt.Errorf("semaphore %q: set adaptive: %w: the limit is fixed; put it in auto mode first (SetAuto, or scheduler permits auto)", s.name, errNotAuto)
		case strings.Contains(err.Error(), "not the controller"):
			return 0, fmt.Errorf("semaphore %q: set adaptive: %w", s.name, errNotController)
		}
		if res == nil {
			return 0, err
		}
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != 3 {
		return 0, fmt.Errorf("semaphore %q: set adaptive: unexpected reply %v", s.name, res)
	}
	limit, _ := vals[1].(int64)
	return int(limit), err
}

// parseAuto reads the auto mode's record (scripts/lib.lua, AUTO_PATTERN)
// as of now (ms, Redis time); "" is fixed mode.
func parseAuto(rec string, now int64) AutoState {
	f := strings.SplitN(rec, ":", 9)
	if len(f) != 9 || (f[0] != string(ModeAuto) && f[0] != string(ModeShadow)) {
		return AutoState{Mode: ModeFixed}
	}
	num := func(s string) int64 { return parseInt(s) }
	a := AutoState{
		Mode: Mode(f[0]),
		Min:  int(num(f[1])), Max: int(num(f[2])), Fixed: int(num(f[3])),
		Controller: int(num(f[5])),
		Why:        f[7],
		Reason:     f[8],
	}
	if until := num(f[4]); until > now {
		a.HoldLeft = ms(until - now)
	}
	if moved := num(f[6]); moved > 0 && moved <= now {
		a.MovedAgo = ms(now - moved)
	}
	return a
}
