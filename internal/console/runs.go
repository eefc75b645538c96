package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// maxRuns is how many runs the runs page lists, newest first.
const maxRuns = 200

// maxFailures is how many failed pages a run's page lists.
const maxFailures = 100

var states = []mapreduce.State{mapreduce.StateSplitting, mapreduce.StateMapping, mapreduce.StateReducing,
	mapreduce.StateSucceeded, mapreduce.StateFailed, mapreduce.StateCancelled}

// runRow is a run as the pages show it.
type runRow struct {
	*mapreduce.Status
	Pages   int     // recorded: done and failed
	Percent float64 // of the total, 0 while splitting
	Rate    string  // pages/s since the run (or its last retry) started
	ETA     string  // at that rate; empty when ended, unknown or stalled
	Stalled string  // how long an active run has not changed, once Status.Stalled says so
	Took    string
	Link    string
	Cancel  bool // can be cancelled
	Retry   bool // can be retried
	// ArgsRefused: the job refused the run's arguments, so a retry would
	// fail the same way; a new run with other arguments is the fix.
	ArgsRefused bool
	Of          string // the total, "~N" while the split runs and said to expect N, or "?"
	Tasks       string // how the run gives its pages to tasks (TasksText)
}

func row(st *mapreduce.Status, now time.Time) runRow {
	r := runRow{Status: st, Pages: st.Done + st.Failed,
		Link:   "/run?" + url.Values{"id": {st.ID}}.Encode(),
		Cancel: !st.State.Ended(), Retry: (st.State == mapreduce.StateFailed || st.State == mapreduce.StateCancelled) && !st.ArgsRefused(),
		ArgsRefused: st.ArgsRefused()}
	total, _ := st.Pages()
	r.Of, r.Tasks = PagesText(st), TasksText(st)
	if total > 0 {
		r.Percent = min(100, float64(r.Pages)*100/float64(total))
	} else if st.Total == 0 && st.State.Ended() {
		r.Percent = 100
	}
	if !st.Finished.IsZero() {
		r.Took = duration(st.Finished.Sub(st.Created))
	}
	if rate, ok := st.Rate(now); ok {
		r.Rate = fmt.Sprintf("%.1f", rate)
	}
	if left, ok := st.Remaining(now); ok {
		r.ETA = duration(left)
	}
	if idle, stalled := st.Stalled(now); stalled {
		r.Stalled = duration(idle)
	}
	return r
}

type runsView struct {
	Job, State string
	Jobs       []string
	States     []mapreduce.State
	Runs       []runRow
	More       int // runs past maxRuns, not listed
	Empty      string
}

func (c *Console) runsData(ctx context.Context, r *http.Request) (string, string, any, error) {
	q := r.URL.Query()
	v := runsView{Job: q.Get("job"), State: q.Get("state"), States: states}
	live := "/runs/live?" + url.Values{"job": {v.Job}, "state": {v.State}}.Encode()
	if v.State != "" && v.State != "active" && !slices.Contains(states, mapreduce.State(v.State)) {
		return "Runs", live, v, badRequest("No state %q: use one of splitting, mapping, reducing, succeeded, failed, cancelled or active.", v.State)
	}
	catalogue, err := c.cfg.MapReduce.Jobs(ctx)
	if err != nil {
		return "Runs", live, v, err
	}
	for _, j := range catalogue {
		v.Jobs = append(v.Jobs, j.Name)
	}
	jobs := v.Jobs
	if v.Job != "" {
		jobs = []string{v.Job}
	}
	var list []*mapreduce.Status
	for _, job := range jobs {
		// Summaries, never arguments or results: this page and its
		// fragment are read every second of every open tab.
		read := c.cfg.MapReduce.Runs
		if v.State == "active" {
			read = c.cfg.MapReduce.ActiveRuns
		}
		l, err := read(ctx, job)
		if err != nil {
			if v.Job != "" {
				return "Runs", live, v, badRequest("No runs for job %q: %v", v.Job, err)
			}
			return "Runs", live, v, err
		}
		list = append(list, l...)
	}
	slices.SortStableFunc(list, func(a, b *mapreduce.Status) int { return b.Created.Compare(a.Created) })
	now := time.Now().Add(app.RedisSkew(ctx, c.cfg.Redis)) // as the runs' times are
	for _, st := range list {
		switch {
		case v.State == "active" && st.State.Ended(),
			v.State != "" && v.State != "active" && string(st.State) != v.State:
			continue
		case len(v.Runs) == maxRuns:
			v.More++
			continue
		}
		v.Runs = append(v.Runs, row(st, now))
	}
	if len(v.Runs) == 0 {
		switch {
		case len(catalogue) == 0:
			v.Empty = c.emptyCatalogue()
		default:
			v.Empty = "No runs match."
		}
	}
	return "Runs", live, v, nil
}

type runView struct {
	runRow
	Failures      []mapreduce.PageFailure
	FailuresTotal int
}

// liveValueBytes is the most bytes of a run's arguments, and of its
// result, that the run page's live fragment reads: it is fetched every
// second of every open tab, and larger values are shown by the page itself.
const liveValueBytes = 16 << 10

// runData reads a run whole, for its page.
func (c *Console) runData(ctx context.Context, r *http.Request) (string, string, any, error) {
	return c.readRun(ctx, r, c.cfg.MapReduce.Status)
}

// runLiveData reads a run for its page's live fragment: its arguments and
// result only when small, else a line that says how large they are.
func (c *Console) runLiveData(ctx context.Context, r *http.Request) (string, string, any, error) {
	return c.readRun(ctx, r, func(ctx context.Context, id string) (*mapreduce.Status, error) {
		st, err := c.cfg.MapReduce.StatusUpTo(ctx, id, liveValueBytes)
		if err != nil {
			return nil, err
		}
		if st.Args == nil && st.ArgsBytes > 0 {
			st.Args = []byte(notShownLive(st.ArgsBytes))
		}
		if st.Result == nil && st.ResultBytes > 0 {
			st.Result = []byte(notShownLive(st.ResultBytes))
		}
		return st, nil
	})
}

func notShownLive(n int) string {
	return fmt.Sprintf("(%.1f KiB: too large to refresh every second; reload the page to read it)", float64(n)/1024)
}

func (c *Console) readRun(ctx context.Context, r *http.Request, read func(context.Context, string) (*mapreduce.Status, error)) (string, string, any, error) {
	id := r.FormValue("id") // the query, or a cancel's or retry's form
	live := "/run/live?" + url.Values{"id": {id}}.Encode()
	st, err := read(ctx, id)
	if err != nil {
		if errors.Is(err, mapreduce.ErrRunNotFound) || id == "" || isBadID(err) {
			return "Run not found", live, nil, notFound("No run %q: it never started, or it expired after its retention.", id)
		}
		return "Run", live, nil, err
	}
	v := runView{runRow: row(st, time.Now().Add(app.RedisSkew(ctx, c.cfg.Redis)))}
	v.Failures, v.FailuresTotal, err = c.cfg.MapReduce.Failures(ctx, id, maxFailures)
	if err != nil && !errors.Is(err, mapreduce.ErrRunNotFound) {
		return "Run " + id, live, nil, err
	}
	return "Run " + id, live, v, nil
}

// isBadID reports whether err is mapreduce refusing a malformed run ID,
// which the console treats as an unknown run.
func isBadID(err error) bool { return strings.Contains(err.Error(), "is not a run ID") }

// runMutation cancels or retries the run named by the form, then shows it.
func (c *Console) runMutation(w http.ResponseWriter, r *http.Request, verb, done string, do func(context.Context, string) error) {
	id := r.PostFormValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.cfg.MapReduce.StatusUpTo(ctx, id, 0); err != nil {
		if errors.Is(err, mapreduce.ErrRunNotFound) || id == "" || isBadID(err) {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No run %q to %s: it never started, or it expired after its retention.", id, verb))
			return
		}
		c.failWith(w, r, err)
		return
	}
	link := "/run?" + url.Values{"id": {id}}.Encode()
	if err := do(ctx, id); err != nil {
		code := http.StatusConflict
		if !errors.Is(err, mapreduce.ErrRunEnded) && !errors.Is(err, mapreduce.ErrRunNotEnded) &&
			!errors.Is(err, mapreduce.ErrRunSucceeded) && !errors.Is(err, mapreduce.ErrRunActive) {
			code = http.StatusBadGateway
		}
		v := c.view(r, "run")
		v.Problem = fmt.Sprintf("Could not %s the run: %v", verb, err)
		if lerr := c.load(r, v, c.runData); lerr != nil {
			c.failWith(w, r, lerr)
			return
		}
		c.render(w, code, "run", "layout", v)
		return
	}
	c.log.Info("console: run changed", "run", id, "action", verb)
	http.Redirect(w, r, withDone(link, done), http.StatusSeeOther)
}

func (c *Console) cancel(w http.ResponseWriter, r *http.Request) {
	c.runMutation(w, r, "cancel", "cancelled", c.cfg.MapReduce.Cancel)
}

func (c *Console) retry(w http.ResponseWriter, r *http.Request) {
	c.runMutation(w, r, "retry", "retried", c.cfg.MapReduce.Retry)
}

// emptyCatalogue says where the console looked for jobs (app.EmptyCatalogue).
func (c *Console) emptyCatalogue() string {
	msg := app.EmptyCatalogue(c.cfg.Redis, c.cfg.Prefix)
	return strings.ToUpper(msg[:1]) + msg[1:] + "."
}
