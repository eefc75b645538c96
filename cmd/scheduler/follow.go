package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// pollEvery is how often follow reads the run's status.
const pollEvery = 200 * time.Millisecond

// errorEvery is how often at most follow shows a step's failed attempt.
const errorEvery = 10 * time.Second

// follow polls the run until it ends, drawing progress on w: a bar
// redrawn in place on a terminal, a line whenever it changes otherwise.
// Redis being unreachable does not end it: the run goes on without the
// scheduler, so follow says so once and keeps polling until Redis is back.
// It returns the run's last status, or an error when the run is gone
// (ErrRunNotFound), Redis answers with an error no retry will fix, or ctx
// is done.
func follow(ctx context.Context, c *conn, id string, w io.Writer, tty bool) (*mapreduce.Status, error) {
	// The rate is over the run's own times, which are Redis's: measured
	// against Redis's clock, a skewed host clock does not skew it.
	skew := app.RedisSkew(ctx, c.rdb)
	var last string
	var lastLine time.Time
	// A step's failed attempt is shown as it happens (the split's retries
	// show nothing else), but at most one every errorEvery: an outage
	// fails many pages at once.
	var errorSeen, errorShown time.Time
	unreachable := false
	// A message interrupts the bar: it goes on a line of its own.
	say := func(format string, args ...any) {
		if tty && last != "" {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "scheduler: "+format+"\n", args...)
		last = ""
	}
	for {
		// Polled without its arguments and result, which may take
		// megabytes; read whole once it has ended.
		st, err := c.mr.StatusUpTo(ctx, id, 0)
		if err == nil && st.State.Ended() {
			st, err = c.mr.Status(ctx, id)
		}
		switch {
		case ctx.Err() != nil:
			if tty && last != "" {
				fmt.Fprintln(w)
			}
			return nil, ctx.Err()
		case err == nil:
			if unreachable {
				unreachable = false
				say("%s is back; following %s", c.server, id)
			}
			if e := st.LastError; !st.State.Ended() && e.At.After(errorSeen) && time.Since(errorShown) >= errorEvery {
				errorSeen, errorShown = e.At, time.Now()
				say("%s failed at %s: %s", e.Step, e.At.Local().Format("15:04:05"), strings.TrimPrefix(e.Error, "mapreduce: "))
			}
			line := progressLine(st, time.Now().Add(skew))
			switch {
			case tty:
				fmt.Fprintf(w, "\r%s\x1b[K", line)
			case line != last && (time.Since(lastLine) >= time.Second || st.State.Ended()):
				fmt.Fprintln(w, line)
				lastLine = time.Now()
			}
			last = line
			if st.State.Ended() {
				if tty {
					fmt.Fprintln(w)
				}
				return st, nil
			}
		case errors.Is(err, mapreduce.ErrRunNotFound), !rediserr.Transient(err):
			if tty && last != "" {
				fmt.Fprintln(w)
			}
			return nil, err
		case !unreachable:
			unreachable = true
			say("cannot reach %s (%v); the run goes on: still following %s until Redis is back (Ctrl-C stops following)", c.server, rootCause(err), id)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pollEvery):
		}
	}
}

// followToEnd follows a run until it ends, as 'run --wait' and 'retry
// --wait' do: progress on stderr (follow), then the run's state, pages and
// error on stderr and its result on stdout. It returns nil if the run
// succeeded, app.ExitCode(1) if it did not, app.ExitCode(130) if ctx ended
// first (the run goes on; it says so), and an error when the run cannot be
// followed.
func followToEnd(ctx context.Context, c *conn, id string, stdout, stderr io.Writer) error {
	st, err := follow(ctx, c, id, stderr, isTerminal(stderr))
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "scheduler: stopped following %s (the run goes on)\n", id)
			return errStoppedFollowing
		}
		return errors.New(trim(err))
	}
	since, retried := st.Created, ""
	if st.Retries > 0 {
		since, retried = st.Retried, fmt.Sprintf(" (since retry %d)", st.Retries)
	}
	fmt.Fprintf(stderr, "%s %s in %s%s: %s\n", id, st.State, st.Finished.Sub(since).Round(time.Millisecond), retried, progress(st))
	if st.Error != "" {
		fmt.Fprintf(stderr, "error: %s\n", st.Error)
	}
	if next := retryHint(st); next != "" {
		fmt.Fprintf(stderr, "next: %s\n", next)
	}
	if st.Result != nil {
		fmt.Fprintf(stdout, "%s\n", st.Result)
	}
	if st.State != mapreduce.StateSucceeded {
		return app.ExitCode(1) // the lines above said why
	}
	return nil
}

// errStoppedFollowing: Ctrl-C stopped 'run --wait' or 'retry --wait'
// following a run, which goes on; the usage promises exit 130 for it.
const errStoppedFollowing = app.ExitCode(130)

// retryHint says how to run a failed or cancelled run again, or "". A
// run failed by its arguments needs a new run, not a retry.
func retryHint(st *mapreduce.Status) string {
	switch {
	case st.ArgsRefused():
		return newRunHint(st)
	case st.State == mapreduce.StateFailed:
		return "fix what failed it, then: scheduler retry " + st.ID + " (runs again only the pages that did not succeed)"
	case st.State == mapreduce.StateCancelled:
		return "to finish it: scheduler retry " + st.ID + " (runs only the pages that did not succeed)"
	}
	return ""
}

// newRunHint says how to start a run of st's job with other arguments
// than st's, which its job refused.
func newRunHint(st *mapreduce.Status) string {
	if !json.Valid(st.Args) {
		return "its arguments were refused, and a retry would run with them again: start a new run with other arguments (from Go, Job.Start)"
	}
	if string(st.Args) == "null" {
		return "it ran with no arguments, which its job refused: give them in a new run: scheduler run " + st.Job + " --args JSON ('scheduler jobs' shows the fields)"
	}
	quoted := "'" + strings.ReplaceAll(string(st.Args), "'", `'\''`) + "'"
	return "its arguments were refused, and a retry would run with them again: fix them in a new run: scheduler run " + st.Job + " --args " + quoted
}

// rootCause is the innermost error of a chain: "connection refused"
// rather than every layer that passed it on.
func rootCause(err error) error {
	for {
		inner := errors.Unwrap(err)
		if inner == nil {
			return err
		}
		err = inner
	}
}

func progress(st *mapreduce.Status) string {
	s := fmt.Sprintf("%d/%s done", st.Done, console.PagesText(st))
	if st.Failed > 0 {
		s += fmt.Sprintf(", %d failed", st.Failed)
	}
	return s
}

// progressLine: "[#####.....] 5120/10000 pages  812/s  ETA 6s  0 failed  mapping".
// The rate and ETA are the run's own (Status.Rate), not the time since
// this command began to follow it: following a run started or resumed
// earlier, or one already finished, shows its real rate.
func progressLine(st *mapreduce.Status, now time.Time) string {
	done := st.Done + st.Failed
	total, known := st.Pages()
	rate := "—/s"
	if r, ok := st.Rate(now); ok {
		rate = fmt.Sprintf("%.0f/s", r)
	}
	if !known {
		return fmt.Sprintf("[%s] %d/? pages  %s  (splitting)", strings.Repeat("·", 30), done, rate)
	}
	frac := 1.0
	if total > 0 {
		frac = min(float64(done)/float64(total), 1)
	}
	filled := int(frac * 30)
	eta := "—"
	if d, ok := st.Remaining(now); ok {
		eta = d.Round(time.Second).String()
	}
	return fmt.Sprintf("[%s%s] %d/%s pages  %s  ETA %s  %d failed  %s",
		strings.Repeat("#", filled), strings.Repeat("·", 30-filled), done, console.PagesText(st), rate, eta, st.Failed, st.State)
}
