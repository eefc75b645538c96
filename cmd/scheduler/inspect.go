package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const statusUsage = `scheduler status RUN [--json]: show a run's state, progress and result.

Example:
  scheduler status orders-report:20261121T060000Z --json

Flags:
`

func status(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	url := redisFlag(fs)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	pos := parse(fs, statusUsage, args)
	want(pos, 1, 1, "RUN (a run ID, as 'scheduler run' or 'scheduler runs' print it)")
	c := connect(ctx, *url)
	defer c.close()
	st, err := c.mr.Status(ctx, pos[0])
	if err != nil {
		app.Fail("%v", err)
	}
	if *asJSON {
		printJSON(st)
		return 0
	}
	fmt.Printf("run      %s\njob      %s\nstate    %s\npages    %s\n", st.ID, st.Job, st.State, progress(st))
	fmt.Printf("created  %s\n", st.Created.Format(time.RFC3339))
	if !st.Finished.IsZero() {
		fmt.Printf("finished %s (%s)\n", st.Finished.Format(time.RFC3339), st.Finished.Sub(st.Created).Round(time.Millisecond))
	}
	if st.Error != "" {
		fmt.Printf("error    %s\n", st.Error)
	}
	if st.Result != nil {
		fmt.Printf("result   %s\n", st.Result)
	}
	return 0
}

func progress(st *mapreduce.Status) string {
	total := "?"
	if st.Total >= 0 {
		total = fmt.Sprint(st.Total)
	}
	s := fmt.Sprintf("%d/%s done", st.Done, total)
	if st.Failed > 0 {
		s += fmt.Sprintf(", %d failed", st.Failed)
	}
	return s
}

// jsonStatus is the --json form of a status.
type jsonStatus struct {
	ID        string          `json:"id"`
	Job       string          `json:"job"`
	State     string          `json:"state"`
	Total     int             `json:"total"`
	Done      int             `json:"done"`
	Failed    int             `json:"failed"`
	Created   time.Time       `json:"created"`
	SplitDone *time.Time      `json:"split_done,omitempty"`
	Finished  *time.Time      `json:"finished,omitempty"`
	Error     string          `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
}

func printJSON(st *mapreduce.Status) {
	js := jsonStatus{ID: st.ID, Job: st.Job, State: string(st.State), Total: st.Total, Done: st.Done,
		Failed: st.Failed, Created: st.Created, Error: st.Error}
	if !st.SplitDone.IsZero() {
		js.SplitDone = &st.SplitDone
	}
	if !st.Finished.IsZero() {
		js.Finished = &st.Finished
	}
	if json.Valid(st.Result) {
		js.Result = st.Result
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(js)
}

const runsUsage = `scheduler runs [JOB]: list the runs still within their retention, newest
first: of JOB, or of every bundled job.

Example:
  scheduler runs orders-report

Flags:
`

func runs(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("runs", flag.ContinueOnError)
	url := redisFlag(fs)
	pos := parse(fs, runsUsage, args)
	want(pos, 0, 1, "")
	c := connect(ctx, *url)
	defer c.close()
	jobs := pos
	if len(jobs) == 0 {
		jobs, _ = app.JobNames(ctx)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RUN\tSTATE\tPAGES\tCREATED\tTOOK\tERROR")
	for _, job := range jobs {
		list, err := c.mr.Runs(ctx, job)
		if err != nil {
			app.Fail("%v", err)
		}
		for _, st := range list {
			took := ""
			if !st.Finished.IsZero() {
				took = st.Finished.Sub(st.Created).Round(time.Millisecond).String()
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", st.ID, st.State, progress(st), st.Created.Format(time.RFC3339), took, oneLine(st.Error, 60))
		}
	}
	_ = w.Flush()
	return 0
}

func oneLine(s string, max int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}

const cancelUsage = `scheduler cancel RUN: stop a run. Queued pages do not start, pages at work
see their context cancelled, the reduce does not run.

Example:
  scheduler cancel orders-report:20261121T060000Z

Flags:
`

func cancel(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	url := redisFlag(fs)
	pos := parse(fs, cancelUsage, args)
	want(pos, 1, 1, "RUN")
	c := connect(ctx, *url)
	defer c.close()
	if err := c.mr.Cancel(ctx, pos[0]); err != nil {
		if errors.Is(err, mapreduce.ErrRunEnded) {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		app.Fail("%v", err)
	}
	fmt.Println("cancelled", pos[0])
	return 0
}
