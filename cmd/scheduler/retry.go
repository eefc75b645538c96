package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const retryUsage = `scheduler retry RUN [--wait]: resume a run that failed or was cancelled. Only
its failed and unfinished pages run again: pages that succeeded keep their
results and are not processed again. Once every page is recorded, the
reduce runs again, over all of them. A run that succeeded, or that is still
going, exits 1 saying so.

A run that failed because its database was unreachable for a while (its
pages failed after their retries) needs no new run: fix the database, then
retry it. One that failed because its job refused its arguments does: a
retry runs with the same arguments ('scheduler status RUN' shows them). Tasks of the run's earlier attempt, such as those asynq
archived, do nothing if they are run again.

With --wait, follow the run as 'scheduler run --wait' does: print its
result and exit 0 only if it succeeded.

Example:
  scheduler retry orders-report:20261121T060000Z --wait

Flags:
`

func retry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("retry", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	wait := fs.Bool("wait", false, "follow the run until it ends; exit 0 only if it succeeded")
	c, id, err := connectForRun(ctx, fs, url, retryUsage, args, stdout, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	before, _ := c.mr.Status(ctx, id) // for the message; Retry checks the run
	if before != nil && before.ArgsRefused() {
		fmt.Fprintf(stderr, "scheduler: warning: %s failed because its job refused its arguments: unless the job's code has changed since, this retry fails the same way (%s)\n", id, newRunHint(before))
	}
	err = c.mr.Retry(ctx, id)
	job, _, _ := strings.Cut(id, ":")
	switch {
	case errors.Is(err, mapreduce.ErrRunNotFound):
		return fmt.Errorf("%s: 'scheduler runs %s' lists the runs still kept", trim(err), job)
	case errors.Is(err, mapreduce.ErrRunNotEnded):
		return fmt.Errorf("%s ('scheduler status %s' shows it, 'scheduler cancel %s' stops it)", trim(err), id, id)
	case errors.Is(err, mapreduce.ErrRunSucceeded):
		return fmt.Errorf("%s ('scheduler run %s')", trim(err), job)
	case errors.Is(err, mapreduce.ErrRunActive):
		return fmt.Errorf("%s: 'scheduler cancel RUN' stops that run", trim(err))
	case err != nil:
		return errors.New(trim(err))
	}
	if before != nil {
		fmt.Fprintln(stdout, resuming(before))
	} else {
		fmt.Fprintln(stdout, "resuming", id)
	}
	if !*wait {
		return nil
	}
	return followToEnd(ctx, c, id, stdout, stderr)
}

// resuming says what a retry of the run, as st was before it, runs again.
func resuming(st *mapreduce.Status) string {
	var again string
	switch n := st.Total - st.Done; {
	case st.Total < 0:
		again = "its split runs again and enqueues the pages not done"
		if st.Failed > 0 {
			again += fmt.Sprintf(", the %d failed among them", st.Failed)
		}
	case n == 0:
		again = fmt.Sprintf("every one of its %d pages is done: the reduce runs again", st.Total)
	default:
		again = fmt.Sprintf("%d of %d pages run again (%d failed, %d unfinished)", n, st.Total, st.Failed, n-st.Failed)
	}
	return fmt.Sprintf("resuming %s (%s): %s; %d done pages are kept", st.ID, st.State, again, st.Done)
}
