package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const jobsUsage = `scheduler jobs [--json]: list the jobs of the catalogue — every job a worker
has announced — with its queue, its arguments (each field with its type
and the bounds it states), when a worker last announced it and the live
workers that run it. A job nobody runs any more stays listed, with a
warning: its runs would not start until a worker runs it again. So are
workers that run another version of a job's code under its name (another
argument type, queue or options), as in the middle of a deploy: while both
versions run, a run's tasks go to either.

scheduler jobs forget JOB: remove a retired or renamed job from the
catalogue. Refused while a live worker runs it (it would be announced
again) or a run of it has not ended (cancel it first). Its ended runs stay
readable by ID ('scheduler status RUN') until their retention ends.

Example:
  scheduler jobs
  scheduler jobs --json | jq '.[] | {name, workers: [.workers[].id]}'
  scheduler jobs forget nightly-v1

Flags:
`

func jobs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	asJSON := fs.Bool("json", false, "print the catalogue as JSON: each job's announcement, with its live workers")
	pos, err := parse(fs, jobsUsage, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 && pos[0] == "forget" {
		return forgetJob(ctx, *url, pos, stdout, stderr)
	}
	if err := want(pos, 0, 0, ""); err != nil {
		return err
	}
	c, err := connect(ctx, *url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	all, err := c.mr.Jobs(ctx)
	if err != nil {
		return errors.New(trim(err))
	}
	if *asJSON {
		type jobJSON struct {
			mapreduce.JobInfo
			Workers  []mapreduce.WorkerInfo `json:"workers"`
			Disagree []string               `json:"disagree,omitempty"`
		}
		out := make([]jobJSON, len(all))
		for i, j := range all {
			out[i] = jobJSON{JobInfo: j, Workers: append([]mapreduce.WorkerInfo{}, j.Workers...), Disagree: j.Disagree}
		}
		writeJSON(stdout, out)
		return nil
	}
	if len(all) == 0 {
		fmt.Fprintln(stderr, "scheduler: "+app.EmptyCatalogue(c.rdb, app.Prefix))
		return nil
	}
	printCatalogue(stdout, all)
	printCatalogueWarnings(stdout, all)
	return nil
}

// forgetJob removes the job named in pos ("forget" JOB) from the catalogue.
func forgetJob(ctx context.Context, url redisFlags, pos []string, stdout, stderr io.Writer) error {
	if err := want(pos, 2, 2, "JOB (a job of the catalogue that no live worker runs)"); err != nil {
		return err
	}
	c, err := connect(ctx, url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.mr.ForgetJob(ctx, pos[1]); err != nil {
		return fmt.Errorf("jobs %s", trim(err))
	}
	fmt.Fprintf(stdout, "forgot job %s\n", pos[1])
	return nil
}

// printCatalogue prints the table of the jobs in all, then the table of
// their live workers.
func printCatalogue(stdout io.Writer, all []mapreduce.JobInfo) {
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "JOB\tQUEUE\tWORKERS\tANNOUNCED\tARGS")
	var workers []mapreduce.WorkerInfo
	for _, j := range all {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", j.Name, j.Queue, len(j.Workers), ago(j.Announced), argsOf(j))
		for _, wi := range j.Workers {
			if !slices.ContainsFunc(workers, func(o mapreduce.WorkerInfo) bool { return o.ID == wi.ID }) {
				workers = append(workers, wi)
			}
		}
	}
	_ = w.Flush()
	if len(workers) > 0 {
		slices.SortFunc(workers, func(a, b mapreduce.WorkerInfo) int { return strings.Compare(a.ID, b.ID) })
		fmt.Fprintln(stdout)
		w = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "WORKER\tHOST\tPID\tUP\tSEEN\tJOBS\tVERSION")
		for _, wi := range workers {
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", wi.ID, wi.Host, wi.PID, since(wi.Started), ago(wi.Seen), strings.Join(wi.Jobs, ","), wi.Version)
		}
		_ = w.Flush()
	}
}

// printCatalogueWarnings prints, after a blank line, the warnings of the
// jobs in all: no live worker, versions that differ, workers without a
// database.
func printCatalogueWarnings(stdout io.Writer, all []mapreduce.JobInfo) {
	var warned bool
	for _, j := range all {
		var warnings []string
		switch {
		case len(j.Workers) == 0:
			warnings = append(warnings, noWorker(j.Name))
		case len(j.Disagree) > 0:
			warnings = append(warnings, versionsDiffer(j))
		}
		warnings = append(warnings, withoutDatabase(j)...)
		for _, warning := range warnings {
			if !warned {
				fmt.Fprintln(stdout)
				warned = true
			}
			fmt.Fprintln(stdout, warning)
		}
	}
}

// withoutDatabase warns of the live workers of job j that say they have no
// database while others of j's say they have one (console.WithoutDatabase).
func withoutDatabase(j mapreduce.JobInfo) []string {
	var out []string
	for _, id := range console.WithoutDatabase(j) {
		out = append(out, fmt.Sprintf("WARNING: worker %s runs %s without a database, where other workers of it have one: if %s calls worker.Database, the pages it takes there go back to the queue, slowing its runs; give it DATABASE_URL (and RequireDatabase)", id, j.Name, j.Name))
	}
	return out
}

// versionsDiffer is the warning for a job whose live workers run other
// code under its name.
func versionsDiffer(j mapreduce.JobInfo) string {
	return fmt.Sprintf("WARNING: workers run two versions of %s: %s announce another argument type, queue or options than the entry above (%s), "+
		"and a run's tasks go to any of them, so a run may fail or its pages be read wrongly: finish the deploy (stop the old workers), "+
		"or give the new version another name", j.Name, strings.Join(j.Disagree, ", "), j.ArgsType)
}

// noWorker is the warning for a job no live worker runs.
func noWorker(job string) string {
	return fmt.Sprintf("WARNING: no live worker runs %s: its runs will not start until one does (retired? 'scheduler jobs forget %s')", job, job)
}

// argsOf describes a job's arguments for a person writing --args: the Go
// type and, for JSON, the fields it takes, with what the schema bounds:
// "main.Args {mode string full|delta, page_size integer ≥1 required}".
func argsOf(j mapreduce.JobInfo) string {
	if !j.JSON {
		return j.ArgsType + " (not JSON: start it from Go)"
	}
	var s struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if json.Unmarshal(j.ArgsSchema, &s) != nil || s.Type != "object" {
		return j.ArgsType
	}
	fields := make([]string, 0, len(s.Properties))
	for f, raw := range s.Properties {
		var p struct {
			Type             string            `json:"type"`
			Minimum          *json.Number      `json:"minimum"`
			Maximum          *json.Number      `json:"maximum"`
			ExclusiveMinimum *json.Number      `json:"exclusiveMinimum"`
			ExclusiveMaximum *json.Number      `json:"exclusiveMaximum"`
			Enum             []json.RawMessage `json:"enum"`
		}
		_ = json.Unmarshal(raw, &p)
		desc := []string{f, p.Type}
		for _, b := range []struct {
			n  *json.Number
			op string
		}{{p.Minimum, "≥"}, {p.ExclusiveMinimum, ">"}, {p.Maximum, "≤"}, {p.ExclusiveMaximum, "<"}} {
			if b.n != nil {
				desc = append(desc, b.op+b.n.String())
			}
		}
		if len(p.Enum) > 0 {
			values := make([]string, len(p.Enum))
			for i, v := range p.Enum {
				values[i] = strings.Trim(string(v), `"`)
			}
			desc = append(desc, strings.Join(values, "|"))
		}
		if slices.Contains(s.Required, f) {
			desc = append(desc, "required")
		}
		fields = append(fields, strings.Join(slices.DeleteFunc(desc, func(d string) bool { return d == "" }), " "))
	}
	slices.Sort(fields)
	return j.ArgsType + " {" + strings.Join(fields, ", ") + "}"
}

func since(t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return max(time.Since(t), 0).Round(time.Second).String()
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return since(t) + " ago"
}

// lookupJob returns the catalogue's entry of job, or an error naming the
// jobs there are when it has none. what starts the error.
func lookupJob(ctx context.Context, c *conn, job, what string) (mapreduce.JobInfo, error) {
	all, err := c.mr.Jobs(ctx)
	if err != nil {
		return mapreduce.JobInfo{}, fmt.Errorf("%s: %s", what, trim(err))
	}
	for _, j := range all {
		if j.Name == job {
			return j, nil
		}
	}
	return mapreduce.JobInfo{}, fmt.Errorf("%s: %s", what, c.unknownJob(job, all))
}

// unknownJob says that no job of that name exists, and which do.
func (c *conn) unknownJob(job string, all []mapreduce.JobInfo) string {
	if len(all) == 0 {
		return fmt.Sprintf("no job %q: %s", job, app.EmptyCatalogue(c.rdb, app.Prefix))
	}
	names := make([]string, len(all))
	for i, j := range all {
		names[i] = j.Name
	}
	return fmt.Sprintf("no job %q: no worker has announced one by that name (known jobs: %s): check the name, or start a worker that runs it", job, strings.Join(names, ", "))
}
