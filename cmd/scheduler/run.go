package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const runUsage = `scheduler run JOB [--args JSON] [--key KEY] [--wait]: start a run of any job
of the catalogue ('scheduler jobs' lists them) and print its ID.

--args are checked before anything is created, by a live worker that runs
the job: arguments that do not decode into the job's type, or that its
Validate refuses, exit 1 with its message. With no live worker, --args are
checked against the schema the job's workers announced (field names, JSON
types, ranges), and the run is created with a warning: the job's own
Validate runs when a worker takes the run, and fails it if it refuses.

A job allows one active run at a time unless it sets
JobOptions.AllowOverlap: while one is active, run exits 1 naming it (wait
for it, or 'scheduler cancel' it). --key names the run, for a start that
must happen once (a cron tick, a deploy step): a second start with the same
key gets the same run, whose ID is printed with a note on stderr; one whose
--args mean otherwise exits 1 showing both (they would not be used).

With --wait, follow the run — a live progress bar on a terminal, a line
per change otherwise — print its result and exit 0 only if it succeeded.
If Redis becomes unreachable meanwhile, the run goes on and so does the
following, until Redis is back; Ctrl-C stops following (exit 130) and
leaves the run going.

Example:
  scheduler run orders-report --args '{"page_size": 5000, "slow_ms": 50}' --wait

Flags:
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	argsJSON := fs.String("args", "", "the run's arguments, as JSON (default: none, the zero value)")
	key := fs.String("key", "", "names the run: runs started with the same key are one run (default: new)")
	wait := fs.Bool("wait", false, "follow the run until it ends; exit 0 only if it succeeded")
	pos, err := parse(fs, runUsage, args, stdout)
	if err != nil {
		return app.WithUnknownFlagHint(err, `a job's arguments go in --args, as JSON: --args '{"page_size": 1000}'`)
	}
	if err := want(pos, 1, 1, "JOB (a job of the catalogue: see 'scheduler jobs')"); err != nil {
		return err
	}
	job := pos[0]
	var a json.RawMessage
	if *argsJSON != "" {
		if err := app.JSONError(*argsJSON); err != nil {
			return app.Usagef("--args %.100q is not JSON (%v): keys and strings take double quotes, and the whole takes single quotes for the shell, e.g. --args '{\"page_size\": 100}'", *argsJSON, err)
		}
		a = json.RawMessage(*argsJSON)
	}
	c, err := connect(ctx, *url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	what := "run " + job
	info, err := lookupJob(ctx, c, job, what)
	if err != nil {
		return err
	}
	if !info.JSON {
		return fmt.Errorf("%s: the job's arguments are not JSON (its codec is its own): start it from Go with Job.Start", what)
	}
	if len(info.Workers) == 0 {
		// Nobody can run the job's Validate before the run exists: check
		// at least what the workers announced, rather than create a run
		// that fails at its split.
		if err := checkArgs(info.ArgsSchema, a); err != nil {
			return fmt.Errorf("%s: --args: %v", what, err)
		}
		validate := ""
		if info.Validates {
			validate = "; the job's own Validate has not checked --args: it runs when a worker takes the run, and fails the run if it refuses them"
		}
		fmt.Fprintf(stderr, "scheduler: warning: no live worker runs %s, so the run will wait until one starts ('scheduler jobs' shows the job's workers)%s\n", job, validate)
	}
	id, err := c.mr.StartJSON(ctx, job, a, mapreduce.StartOptions{Key: *key})
	switch {
	case errors.Is(err, mapreduce.ErrRunExists):
		// Arguments that mean the same may be written otherwise (a default
		// spelled out, {} for none): only other values are refused, so that
		// a script never takes a run of other arguments for its own.
		if st, serr := c.mr.Status(ctx, id); serr == nil && *argsJSON != "" && !sameArgs(info.ArgsSchema, st.Args, a) {
			return fmt.Errorf("run %s already exists (--key %s names it) with other arguments, %s, than these, %s, which were not used: use another --key for a run of these, or leave --args out to get that run", id, *key, st.Args, a)
		}
		if *wait {
			fmt.Fprintf(stderr, "scheduler: run %s already exists (--key %s names it); following it\n", id, *key)
		} else {
			fmt.Fprintf(stderr, "scheduler: run %s already exists (--key %s names it): no new run was started; use another --key for one\n", id, *key)
		}
	case errors.Is(err, mapreduce.ErrInvalidArgs):
		// A worker's answer repeats what the error wraps: say it once.
		return errors.New(trim(err))
	case errors.Is(err, mapreduce.ErrRunActive):
		return fmt.Errorf("%s: wait for that run to end, or stop it with 'scheduler cancel RUN'", trim(err))
	case err != nil:
		return errors.New(trim(err))
	}
	fmt.Fprintln(stdout, id)
	if !*wait {
		return nil
	}
	return followToEnd(ctx, c, id, stdout, stderr)
}

// isTerminal reports whether w is a terminal, on which follow redraws
// its bar in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
