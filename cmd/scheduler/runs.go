package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const runsUsage = `scheduler runs [JOB] [--state STATE]: list the runs still within their
retention, newest first: of JOB, or of every job of the catalogue.

STATE is one of splitting, mapping, reducing, succeeded, failed, cancelled,
or active (any state but the last three).

Example:
  scheduler runs orders-report --state failed

Flags:
`

var states = []mapreduce.State{mapreduce.StateSplitting, mapreduce.StateMapping, mapreduce.StateReducing,
	mapreduce.StateSucceeded, mapreduce.StateFailed, mapreduce.StateCancelled}

func runs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("runs", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	state := fs.String("state", "", "list only the runs in this state (or active: not ended)")
	pos, err := parse(fs, runsUsage, args, stdout)
	if err != nil {
		return err
	}
	if err := want(pos, 0, 1, ""); err != nil {
		return err
	}
	if *state != "" && *state != "active" && !slices.Contains(states, mapreduce.State(*state)) {
		return app.Usagef("--state %q: use one of %s or active", *state, joinStates())
	}
	c, err := connect(ctx, *url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	catalogue, err := c.mr.Jobs(ctx)
	if err != nil {
		return fmt.Errorf("runs: %s", trim(err))
	}
	var jobs []string
	for _, j := range catalogue {
		jobs = append(jobs, j.Name)
	}
	var list []*mapreduce.Status
	if len(pos) == 1 {
		list, err = listRuns(ctx, c, pos[0], *state)
		// A job the catalogue lost may still have runs: show them.
		if !slices.Contains(jobs, pos[0]) && (err != nil || len(list) == 0) {
			return fmt.Errorf("runs: %s", c.unknownJob(pos[0], catalogue))
		}
		if err != nil {
			return fmt.Errorf("runs: %s", trim(err))
		}
	} else {
		if len(jobs) == 0 {
			fmt.Fprintln(stderr, "scheduler: no runs to list: "+app.EmptyCatalogue(c.rdb, app.Prefix))
			return nil
		}
		for _, job := range jobs {
			l, err := listRuns(ctx, c, job, *state)
			if err != nil {
				return fmt.Errorf("runs: %s", trim(err))
			}
			list = append(list, l...)
		}
		slices.SortStableFunc(list, func(a, b *mapreduce.Status) int { return b.Created.Compare(a.Created) })
	}
	list = slices.DeleteFunc(list, func(st *mapreduce.Status) bool {
		switch *state {
		case "":
			return false
		case "active":
			return st.State.Ended()
		}
		return string(st.State) != *state
	})
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RUN\tSTATE\tPAGES\tCREATED\tTOOK\tERROR")
	for _, st := range list {
		took := ""
		if !st.Finished.IsZero() {
			took = st.Finished.Sub(st.Created).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", st.ID, st.State, progress(st), st.Created.Format(time.RFC3339), took, oneLine(shortError(st), 60))
	}
	_ = w.Flush()
	return nil
}

// listRuns reads the summaries of job's runs: for --state active, from
// the job's index of runs not ended alone.
func listRuns(ctx context.Context, c *conn, job, state string) ([]*mapreduce.Status, error) {
	if state == "active" {
		return c.mr.ActiveRuns(ctx, job)
	}
	return c.mr.Runs(ctx, job)
}

func joinStates() string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

// shortError is a run's error for a column: without the run ID the row
// already shows ("split of <ID> after 3 pages: …" reads "split after 3
// pages: …") and the package prefix, so that the cause fits.
func shortError(st *mapreduce.Status) string {
	s := strings.TrimPrefix(st.Error, "mapreduce: ")
	return strings.Replace(s, " of "+st.ID, "", 1)
}

func oneLine(s string, max int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if r := []rune(s); len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return s
}
