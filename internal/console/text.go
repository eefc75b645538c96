package console

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/procname"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// PagesText is a run's Pages as people read it: the total, "~N" while the
// split runs and said to expect N pages, or "?" while neither is known.
func PagesText(st *mapreduce.Status) string {
	n, ok := st.Pages()
	switch {
	case !ok:
		return "?"
	case st.Total < 0:
		return "~" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}

// TasksText says, as people read it, how a run gives its pages to map
// tasks and what by: "64 pages a task from page 512 (Map takes under 1µs
// a page on average)", "a task a page (Map takes 3ms …)", or "" before
// any page is recorded.
func TasksText(st *mapreduce.Status) string {
	avg := st.MapAverage.String()
	if st.MapAverage < time.Microsecond {
		avg = "under 1µs"
	}
	switch {
	case st.PagesPerTask > 1:
		return fmt.Sprintf("%d pages a task from page %d (Map takes %s a page on average)", st.PagesPerTask, st.PackedFrom, avg)
	case st.MapAverage > 0:
		return fmt.Sprintf("a task a page (Map takes %s a page on average)", avg)
	}
	return ""
}

// WithoutDatabase returns the IDs of job j's live workers that say they
// have no database (WorkerInfo.Database) while others of its workers say
// they have one: if the job calls worker.Database, the pages those take
// are handed back to the queue, which slows its runs. Workers that say
// nothing are left out.
func WithoutDatabase(j mapreduce.JobInfo) []string {
	var with bool
	var without []string
	for _, w := range j.Workers {
		switch {
		case w.Database == nil: // says nothing
		case *w.Database:
			with = true
		default:
			without = append(without, w.ID)
		}
	}
	if !with {
		return nil
	}
	return without
}

// WorkerOf names the live worker among workers that a semaphore handle's
// process (semaphore.ProcessStats.Process) belongs to, by its host and
// pid, or returns "(none)": a process that stopped or was killed, whose
// permits come back when their leases run out, or one that is no worker.
// A worker that WorkerInfo.Silent says is silent as of now (Redis's
// time) is named with "(silent 17s)": most likely killed, its entry not yet expired. The semaphore
// names processes host-pid-random, the catalogue names workers by IDs of
// their own: this is what links the two.
func WorkerOf(process string, workers []mapreduce.WorkerInfo, now time.Time) string {
	for _, w := range workers {
		if strings.HasPrefix(process, procname.Prefix(w.Host, w.PID)) {
			if d, silent := w.Silent(now); silent {
				return w.ID + " (silent " + d.Round(time.Second).String() + ")"
			}
			return w.ID
		}
	}
	return "(none)"
}

// AutoText says, in one line, an auto mode's bounds and fixed N, why the
// limit last moved, and the controller's last N with its reason.
func AutoText(a semaphore.AutoState) string {
	var why string
	switch a.Why {
	case "operator":
		why = "set by the operator (permits auto)"
	case "controller":
		why = fmt.Sprintf("set by the controller, holds %s more", a.HoldLeft.Round(time.Second))
	case "fallback":
		why = "fell back to the fixed N: the controller's N stopped holding"
	default:
		why = a.Why
	}
	window := ""
	if a.Window > 0 {
		window = ", window " + a.Window.String()
	}
	text := fmt.Sprintf("%s mode: bounds %d..%d, fixed N %d%s; the limit last moved %s ago: %s", a.Mode, a.Min, a.Max, a.Fixed, window, a.MovedAgo.Round(time.Second), why)
	if a.Controller > 0 {
		verb := "set"
		if a.Mode == semaphore.ModeShadow {
			verb = "would set"
		}
		text += fmt.Sprintf("; the controller %s %d (%s)", verb, a.Controller, a.Reason)
	}
	return text
}

// WindowText says, in one line, what the controller read in its last
// window, or "" before its first.
func WindowText(g semaphore.ControllerSignals) string {
	if g.Epoch == 0 {
		return ""
	}
	text := fmt.Sprintf("its last window (%s, %s ago): %d ok, %d errors, %d timeouts; latency %s against a baseline of %s; %.1f in use, %d waiting",
		g.Window.Round(time.Millisecond), g.Age.Round(time.Second), g.OK, g.Errors, g.Overload, g.Latency.Round(100*time.Microsecond), g.Baseline.Round(100*time.Microsecond), g.InUse, g.Waiting)
	if g.Probe > 0 {
		text += fmt.Sprintf("; probe %s against %s", g.Probe.Round(10*time.Microsecond), g.ProbeBaseline.Round(10*time.Microsecond))
	}
	return text
}
