package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

const permitsUsage = `scheduler permits get [NAME] [--verbose] | permits set NAME N |
permits auto NAME --min A --max B [--fixed N] [--shadow] [--window D]: show or change a
fleet-wide semaphore, such as the workers' database permits ("db").

'get' shows the limit and the permits held, in auto mode the bounds, the
fixed N and why the limit last moved, then one line per process:
the live worker it belongs to ("(none)": stopped or killed, its permits
return when their leases run out; or no worker), how many permits it holds
and how many requests it has queued, their weights, its longest hold and
its oldest wait; --verbose lists every permit and every queued request
too. Without NAME, every semaphore a live worker announces. A NAME that Redis has no limit for and no live
worker uses exits 1.

'set' changes the limit for every worker at once, and makes it fixed
(ending auto mode): raising it wakes waiters now; lowering it lets
holders finish and grants nobody until the permits held fit. N is a whole
number from 1 to 1048576. A NAME that Redis has no limit for and no live
worker uses is refused as a likely typo, unless --new says it is a
semaphore that workers will use ("db", the workers' database permits, is
always accepted).

'auto' puts the limit in auto mode: a controller sets it within
[--min, --max]; each N it sets holds for a while, then the limit falls
back to the fixed N (--fixed, or the limit as it stands, clamped into the
bounds) when it stops. The workers elect the controller among them; it
moves N from how long their queries hold permits and a probe of the
database (docs/semaphore.md). A request is refused as too heavy only
above --max. --shadow records what the controller would set and never
applies it. 'set' ends auto mode.

Examples:
  scheduler permits get
  scheduler permits get db --verbose
  scheduler permits set db 12
  scheduler permits set exports 4 --new
  scheduler permits auto db --min 2 --max 32
  scheduler permits auto db --min 2 --max 32 --fixed 8 --shadow --window 5s

Flags:
`

func permits(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("permits", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	verbose := fs.Bool("verbose", false, "get: list every permit held and every request queued too")
	isNew := fs.Bool("new", false, "set, auto: the semaphore is new, used by no live worker yet (without it, such a name is refused as a likely typo, and db is set with a warning)")
	var auto semaphore.AutoLimits
	fs.IntVar(&auto.Min, "min", 0, "auto: the lowest limit the controller may set (at least 1)")
	fs.IntVar(&auto.Max, "max", 0, "auto: the highest limit the controller may set, and the heaviest request taken (at most 1048576)")
	fs.IntVar(&auto.Fixed, "fixed", 0, "auto: the operator's N, the limit whenever no controller's N holds (default: the limit as it stands, clamped into the bounds)")
	fs.BoolVar(&auto.Shadow, "shadow", false, "auto: record the controller's N, never apply it")
	fs.DurationVar(&auto.Window, "window", 0, "auto: how often the controller decides, for the whole fleet: several times a typical query's time (100ms to 10m; default: as set before, else 1s)")
	pos, err := parse(fs, permitsUsage, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return app.Usagef("missing get, set or auto")
	}
	switch pos[0] {
	case "get":
		return permitsGet(ctx, *url, pos, *verbose, stdout, stderr)
	case "set":
		return permitsSet(ctx, *url, pos, *isNew, stdout, stderr)
	case "auto":
		return permitsAuto(ctx, *url, pos, auto, *isNew, stdout, stderr)
	default:
		return app.Usagef("permits %q: use get, set or auto", pos[0])
	}
}

// permitsGet shows the semaphores named in pos ("get" [NAME]), or, without
// a name, every semaphore a live worker announces.
func permitsGet(ctx context.Context, url redisFlags, pos []string, verbose bool, stdout, stderr io.Writer) error {
	if err := want(pos, 1, 2, ""); err != nil {
		return err
	}
	c, err := connect(ctx, url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	inUse, err := announcedSemaphores(ctx, c)
	if err != nil {
		return err
	}
	names := inUse
	if len(pos) == 2 {
		names = pos[1:]
	} else if len(names) == 0 {
		fmt.Fprintln(stderr, "scheduler: no live worker announces a semaphore: name one, e.g. scheduler permits get "+app.SemaphoreName)
		return nil
	}
	// Each process is shown with the live worker it belongs to, if any:
	// the semaphore names processes by host and pid, the catalogue
	// names workers by their own IDs.
	workers, _ := c.mr.Workers(ctx)
	now := time.Now().Add(app.RedisSkew(ctx, c.rdb)) // as the workers' heartbeats are
	for i, name := range names {
		st, err := stats(ctx, c, name)
		if err != nil {
			return err
		}
		if st.Limit == 0 && !slices.Contains(inUse, name) {
			return fmt.Errorf("permits get %s: no semaphore %q: Redis has no limit for it and no live worker uses it (%s)", name, name, inUseText(inUse))
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printStats(stdout, st, verbose, workers, now)
	}
	return nil
}

// permitsSet sets the limit of the semaphore named in pos ("set" NAME N),
// refusing a likely typo unless isNew.
func permitsSet(ctx context.Context, url redisFlags, pos []string, isNew bool, stdout, stderr io.Writer) error {
	if err := want(pos, 3, 3, map[int]string{1: "NAME and N", 2: "N, the new limit"}[len(pos)]); err != nil {
		return err
	}
	// Atoi refuses a number past int's range (ErrRange), so none wraps.
	n, err := strconv.Atoi(pos[2])
	if err != nil || n < 1 || n > semaphore.MaxLimit {
		return app.Usagef("permits set %s %s: N must be a whole number of at least 1 and at most %d, the largest limit a semaphore takes", pos[1], pos[2], semaphore.MaxLimit)
	}
	c, err := connect(ctx, url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	s, before, err := openToChange(ctx, c, "set", pos[1], isNew, stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.SetLimit(ctx, n); err != nil {
		return fmt.Errorf("permits set %s: %v", pos[1], err)
	}
	after, err := stats(ctx, c, pos[1])
	if err != nil {
		return err
	}
	printSet(stdout, before, after)
	return nil
}

// openToChange opens the named semaphore for a change (verb: "set" or
// "auto") and returns its stats before, refusing a likely typo unless
// isNew.
func openToChange(ctx context.Context, c *conn, verb, name string, isNew bool, stderr io.Writer) (*semaphore.Semaphore, semaphore.Stats, error) {
	// "db" is every worker's database semaphore: setting it before the
	// workers start is the usual first step, never a typo.
	before, err := stats(ctx, c, name)
	if err != nil {
		return nil, before, err
	}
	inUse, err := announcedSemaphores(ctx, c)
	if err != nil {
		return nil, before, err
	}
	if !isNew && name != app.SemaphoreName && before.Limit == 0 && !slices.Contains(inUse, name) {
		return nil, before, fmt.Errorf("permits %s %s: no live worker uses a semaphore %q and Redis has no limit for it (%s): check the name, "+
			"or add --new to set the limit of a semaphore before any worker uses it", verb, name, name, inUseText(inUse))
	}
	if !isNew && !slices.Contains(inUse, name) {
		// Set before the workers start, as intended (--new says so);
		// or, under the wrong prefix, a change no running worker sees.
		fmt.Fprintf(stderr, "scheduler: no live worker under BATCHMR_PREFIX=%q uses semaphore %s: the limit is for workers that start under this prefix (--new says that is meant); if you meant a running fleet, check BATCHMR_PREFIX\n", app.Prefix, name)
	}
	s, err := open(c, name)
	return s, before, err
}

// permitsAuto puts the semaphore named in pos ("auto" NAME) in auto (or
// shadow) mode within the bounds a gives, refusing a likely typo unless
// isNew.
func permitsAuto(ctx context.Context, url redisFlags, pos []string, a semaphore.AutoLimits, isNew bool, stdout, stderr io.Writer) error {
	if err := want(pos, 2, 2, "NAME"); err != nil {
		return err
	}
	name := pos[1]
	switch {
	case a.Min < 1:
		return app.Usagef("permits auto %s: --min %d: give the lowest limit the controller may set, at least 1", name, a.Min)
	case a.Max > semaphore.MaxLimit:
		return app.Usagef("permits auto %s: --max %d: give the highest limit the controller may set, at most %d", name, a.Max, semaphore.MaxLimit)
	case a.Max < a.Min:
		return app.Usagef("permits auto %s: --max %d is below --min %d: give a --max of at least --min", name, a.Max, a.Min)
	case a.Fixed != 0 && (a.Fixed < a.Min || a.Fixed > a.Max):
		return app.Usagef("permits auto %s: --fixed %d is outside [%d, %d]: give a fixed N within --min and --max, or leave it out to keep the limit as it stands", name, a.Fixed, a.Min, a.Max)
	case a.Window != 0 && (a.Window < semaphore.MinWindow || a.Window > semaphore.MaxWindow):
		return app.Usagef("permits auto %s: --window %v: give one from %v to %v, several times a typical query's time", name, a.Window, semaphore.MinWindow, semaphore.MaxWindow)
	}
	c, err := connect(ctx, url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	s, before, err := openToChange(ctx, c, "auto", name, isNew, stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	if a.Fixed == 0 && before.Limit == 0 {
		return app.Usagef("permits auto %s: Redis has no limit for it yet: give the fixed N with --fixed", name)
	}
	if err := s.SetAuto(ctx, a); err != nil {
		return fmt.Errorf("permits auto %s: %v", name, err)
	}
	after, err := stats(ctx, c, name)
	if err != nil {
		return err
	}
	printSet(stdout, before, after)
	return nil
}

// printSet says what setting the limit did, from the semaphore's stats
// before and after: the limit it replaced, what is held and waiting now,
// the queued requests it refused for weighing more than the new limit, and,
// to whoever lowered it below the permits held, that nobody is granted one
// until enough holders finish.
func printSet(out io.Writer, before, st semaphore.Stats) {
	from := "none"
	if before.Limit > 0 {
		from = strconv.Itoa(before.Limit)
	}
	fmt.Fprintf(out, "semaphore %s: limit %d (was %s), held %d, %d waiting\n", st.Name, st.Limit, from, st.Held, len(st.Waiters))
	switch {
	case st.Auto.Mode != semaphore.ModeFixed:
		fmt.Fprintln(out, autoText(st.Auto))
	case before.Auto.Mode != semaphore.ModeFixed:
		fmt.Fprintf(out, "%s mode ended: the limit is fixed\n", before.Auto.Mode)
	}
	// A request is refused above the limit, in auto mode above max.
	bound := st.Limit
	if st.Auto.Mode == semaphore.ModeAuto {
		bound = st.Auto.Max
	}
	heavy := 0
	for _, w := range before.Waiters {
		if w.Weight > bound {
			heavy++
		}
	}
	if heavy > 0 {
		fmt.Fprintf(out, "%d queued request(s) weighed more than %d and were refused: their Acquire returns ErrExceedsLimit\n", heavy, bound)
	}
	if st.Held > st.Limit {
		fmt.Fprintf(out, "%d permits are held, more than the limit: their holders finish, and nobody is granted a permit until fewer than %d are held\n", st.Held, st.Limit)
	}
}

// autoText says an auto mode's bounds, fixed N, why the limit last moved
// and the controller's last N, then, on a line of its own, the controller's
// last window.
func autoText(a semaphore.AutoState) string {
	if w := console.WindowText(a.Signals); w != "" {
		return console.AutoText(a) + "\n" + w
	}
	return console.AutoText(a)
}

// inUseText lists the semaphores live workers use, for a message.
func inUseText(inUse []string) string {
	if len(inUse) == 0 {
		return "none is in use"
	}
	return "in use: " + strings.Join(inUse, ", ")
}

// announcedSemaphores returns the semaphores live workers announce, sorted.
func announcedSemaphores(ctx context.Context, c *conn) ([]string, error) {
	workers, err := c.mr.Workers(ctx)
	if err != nil {
		return nil, fmt.Errorf("permits: %s", trim(err))
	}
	var names []string
	for _, w := range workers {
		names = append(names, w.Semaphores...)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// open returns a handle on the named semaphore; the limit it is given is
// never written (Stats and SetLimit do not use it). A name no semaphore
// takes is a *app.UsageError.
func open(c *conn, name string) (*semaphore.Semaphore, error) {
	s, err := semaphore.New(c.rdb, name, semaphore.Options{Limit: 1, Prefix: app.SemaphorePrefix(app.Prefix)})
	if err != nil {
		return nil, app.Usagef("%v", err)
	}
	return s, nil
}

func stats(ctx context.Context, c *conn, name string) (semaphore.Stats, error) {
	s, err := open(c, name)
	if err != nil {
		return semaphore.Stats{}, err
	}
	defer s.Close()
	st, err := s.Stats(ctx)
	if err != nil {
		return st, fmt.Errorf("permits get %s: %v", name, err)
	}
	return st, nil
}

func printStats(out io.Writer, st semaphore.Stats, verbose bool, workers []mapreduce.WorkerInfo, now time.Time) {
	waiting := 0
	for _, q := range st.Waiters {
		waiting += q.Weight
	}
	procs := st.ByProcess()
	limit := fmt.Sprintf("limit %d", st.Limit)
	if st.Limit == 0 {
		limit = "no limit set yet (the first worker to take a permit sets it)"
	}
	plural := "es"
	if len(procs) == 1 {
		plural = ""
	}
	fmt.Fprintf(out, "semaphore %s: %s, held %d, %d waiting (weight %d), %d process%s\n", st.Name, limit, st.Held, len(st.Waiters), waiting, len(procs), plural)
	if st.Auto.Mode != semaphore.ModeFixed {
		fmt.Fprintln(out, autoText(st.Auto))
	}
	if len(procs) == 0 {
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PROCESS\tWORKER\tHOLDS\tWEIGHT\tLONGEST HOLD\tWAITS\tWEIGHT\tOLDEST WAIT")
	for _, p := range procs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%d\t%d\t%s\n", p.Process, console.WorkerOf(p.Process, workers, now), p.Holds, p.Held, dur(p.Holds, p.LongestHold), p.Waits, p.Waiting, dur(p.Waits, p.OldestWait))
	}
	_ = w.Flush()
	if !verbose {
		return
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\tPROCESS\tWEIGHT\tFENCE\tFOR\tLEASE LEFT")
	for _, h := range st.Holders {
		fmt.Fprintf(w, "holds\t%s\t%d\t%d\t%s\t%s\n", h.Process, h.Weight, h.Fence, h.HeldFor.Round(time.Millisecond), h.LeaseLeft.Round(time.Millisecond))
	}
	for _, q := range st.Waiters {
		fmt.Fprintf(w, "waits\t%s\t%d\t\t%s\t\n", q.Process, q.Weight, q.Age.Round(time.Millisecond))
	}
	_ = w.Flush()
}

// dur is the longest hold or the oldest wait of n permits or requests.
func dur(n int, d time.Duration) string {
	if n == 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}
