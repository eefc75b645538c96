package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const statusUsage = `scheduler status RUN [--json]: show a run's state, progress and result.
--json also gives pages_per_second and remaining_seconds: the run's own
rate since it started or was last retried, and the time left at it
(absent once the run is stalled: unchanged for a minute or more, which
"stalled" says, with "updated", when it last changed), and pages_per_task,
packed_from (absent when 0) and map_average_seconds (absent before any
page is measured, or under 1µs): the most pages a map task carries from
which page on, and Map's average time so far (the "tasks" line).

Example:
  scheduler status orders-report:20261121T060000Z --json

Flags:
`

func status(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	asJSON := fs.Bool("json", false, "print the status as JSON")
	c, id, err := connectForRun(ctx, fs, url, statusUsage, args, stdout, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	st, err := c.mr.Status(ctx, id)
	if err != nil {
		return errors.New(trim(err))
	}
	now := time.Now().Add(app.RedisSkew(ctx, c.rdb))
	if *asJSON {
		printJSON(stdout, st, now)
		return nil
	}
	fmt.Fprintf(stdout, "run      %s\njob      %s\nstate    %s\npages    %s\n", st.ID, st.Job, st.State, progress(st))
	if json.Valid(st.Args) {
		fmt.Fprintf(stdout, "args     %s\n", st.Args)
	}
	if idle, stalled := st.Stalled(now); stalled {
		fmt.Fprintf(stdout, "changed  %s (%s ago: nothing recorded since; unless its pages take this long, look at 'last err', the workers' logs and /readyz, and the database's pg_stat_activity)\n",
			st.Updated.Format(time.RFC3339), idle.Round(time.Second))
	} else if !st.State.Ended() && !st.Updated.IsZero() {
		fmt.Fprintf(stdout, "changed  %s (%s ago)\n", st.Updated.Format(time.RFC3339), max(now.Sub(st.Updated), 0).Round(time.Second))
	}
	if line := console.TasksText(st); line != "" {
		fmt.Fprintf(stdout, "tasks    %s\n", line)
	}
	fmt.Fprintf(stdout, "created  %s\n", st.Created.Format(time.RFC3339))
	if st.Retries > 0 {
		fmt.Fprintf(stdout, "retried  %s (retry %d)\n", st.Retried.Format(time.RFC3339), st.Retries)
	}
	if !st.Finished.IsZero() {
		fmt.Fprintf(stdout, "finished %s (%s)\n", st.Finished.Format(time.RFC3339), st.Finished.Sub(st.Created).Round(time.Millisecond))
	}
	if st.Error != "" {
		fmt.Fprintf(stdout, "error    %s\n", st.Error)
	}
	if e := st.LastError; e.Error != "" && e.Error != st.Error {
		fmt.Fprintf(stdout, "last err %s failed at %s: %s\n", e.Step, e.At.Format(time.RFC3339), strings.TrimPrefix(e.Error, "mapreduce: "))
	}
	if st.Result != nil {
		fmt.Fprintf(stdout, "result   %s\n", st.Result)
	}
	if next := retryHint(st); next != "" {
		fmt.Fprintf(stdout, "next     %s\n", next)
	}
	return nil
}

// jsonStatus is the --json form of a status.
type jsonStatus struct {
	ID        string     `json:"id"`
	Job       string     `json:"job"`
	State     string     `json:"state"`
	Total     int        `json:"total"`
	Done      int        `json:"done"`
	Failed    int        `json:"failed"`
	Created   time.Time  `json:"created"`
	SplitDone *time.Time `json:"split_done,omitempty"`
	Finished  *time.Time `json:"finished,omitempty"`
	// Updated: when the run last changed; Stalled: an active run has not
	// for a minute (Status.Stalled).
	Updated *time.Time `json:"updated,omitempty"`
	Stalled bool       `json:"stalled,omitempty"`
	Retries int        `json:"retries,omitempty"`
	Retried *time.Time `json:"retried,omitempty"`
	// RetriedDone: the pages the last retry kept (-1: not known).
	RetriedDone *int `json:"retried_done,omitempty"`
	// PagesPerSecond and RemainingSeconds: Status.Rate and Remaining, on
	// Redis's clock; absent when not known.
	PagesPerSecond   *float64 `json:"pages_per_second,omitempty"`
	RemainingSeconds *float64 `json:"remaining_seconds,omitempty"`
	// PagesPerTask, PackedFrom and MapAverageSeconds: how the run packs its
	// pages into tasks (Status.PagesPerTask), and what by.
	PagesPerTask      int             `json:"pages_per_task"`
	PackedFrom        int             `json:"packed_from,omitempty"`
	MapAverageSeconds *float64        `json:"map_average_seconds,omitempty"`
	Error             string          `json:"error,omitempty"`
	LastError         *jsonStepError  `json:"last_error,omitempty"`
	Result            json.RawMessage `json:"result,omitempty"`
	// Args: the run's arguments, when they are JSON.
	Args json.RawMessage `json:"args,omitempty"`
}

// jsonStepError is Status.LastError.
type jsonStepError struct {
	Step  string    `json:"step"`
	Error string    `json:"error"`
	At    time.Time `json:"at"`
}

func printJSON(w io.Writer, st *mapreduce.Status, now time.Time) {
	js := jsonStatus{ID: st.ID, Job: st.Job, State: string(st.State), Total: st.Total, Done: st.Done,
		Failed: st.Failed, Created: st.Created, Error: st.Error, Retries: st.Retries,
		PagesPerTask: st.PagesPerTask, PackedFrom: st.PackedFrom}
	if st.MapAverage > 0 {
		secs := st.MapAverage.Seconds()
		js.MapAverageSeconds = &secs
	}
	if !st.Updated.IsZero() {
		js.Updated = &st.Updated
	}
	_, js.Stalled = st.Stalled(now)
	if !st.SplitDone.IsZero() {
		js.SplitDone = &st.SplitDone
	}
	if !st.Finished.IsZero() {
		js.Finished = &st.Finished
	}
	if !st.Retried.IsZero() {
		js.Retried = &st.Retried
		js.RetriedDone = &st.RetriedDone
	}
	if r, ok := st.Rate(now); ok {
		js.PagesPerSecond = &r
	}
	if d, ok := st.Remaining(now); ok {
		secs := d.Seconds()
		js.RemainingSeconds = &secs
	}
	if e := st.LastError; e.Error != "" {
		js.LastError = &jsonStepError{Step: e.Step, Error: e.Error, At: e.At}
	}
	if json.Valid(st.Result) {
		js.Result = st.Result
	}
	if json.Valid(st.Args) {
		js.Args = st.Args
	}
	writeJSON(w, js)
}

// writeJSON prints v as indented JSON on w: every command's --json.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
