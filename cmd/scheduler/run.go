package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const runUsage = `scheduler run JOB [--args JSON] [--key KEY] [--wait]: start a run now and
print its ID. With --wait, follow it — a live progress bar on a terminal,
a line per change otherwise — and exit 0 only if it succeeded.

Example:
  scheduler run orders-report --args '{"page_size": 5000, "slow_ms": 50}' --wait

Flags:
`

func run(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	url := redisFlag(fs)
	argsJSON := fs.String("args", "", "the run's arguments, as JSON (default: none)")
	key := fs.String("key", "", "names the run: runs started with the same key are one run (default: new)")
	wait := fs.Bool("wait", false, "follow the run until it ends; exit 0 only if it succeeded")
	pos := parse(fs, runUsage, args)
	want(pos, 1, 1, "JOB")
	c := connect(ctx, *url)
	defer c.close()
	var a any
	if *argsJSON != "" {
		a = mapreduce.RawArgs(*argsJSON)
	}
	id, err := c.mr.Start(ctx, pos[0], a, mapreduce.StartOptions{Key: *key})
	if errors.Is(err, mapreduce.ErrRunExists) {
		fmt.Fprintf(os.Stderr, "scheduler: run %s already exists; following it\n", id)
	} else if err != nil {
		app.Fail("%v", err)
	}
	fmt.Println(id)
	if !*wait {
		return 0
	}
	st := follow(ctx, c.mr, id, os.Stderr, isTerminal(os.Stderr))
	if st == nil {
		return 1
	}
	fmt.Fprintf(os.Stderr, "%s %s in %s: %s\n", id, st.State, st.Finished.Sub(st.Created).Round(time.Millisecond), progress(st))
	if st.Error != "" {
		fmt.Fprintf(os.Stderr, "error: %s\n", st.Error)
	}
	if st.Result != nil {
		fmt.Printf("%s\n", st.Result)
	}
	if st.State != mapreduce.StateSucceeded {
		return 1
	}
	return 0
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// follow polls the run until it ends, drawing progress on w: a bar
// redrawn in place on a terminal, a line whenever it changes otherwise.
func follow(ctx context.Context, mr *mapreduce.Client, id string, w io.Writer, tty bool) *mapreduce.Status {
	start := time.Now()
	var last string
	var lastLine time.Time
	failures := 0
	for {
		st, err := mr.Status(ctx, id)
		if err != nil {
			// Redis may blink; the run goes on regardless.
			if failures++; failures > 25 || errors.Is(err, mapreduce.ErrRunNotFound) {
				fmt.Fprintf(w, "\nscheduler: %v\n", err)
				return nil
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		failures = 0
		line := progressLine(st, time.Since(start))
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
			return st
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(w, "\nscheduler: stopped following %s (the run goes on)\n", id)
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// progressLine: "[#####.....] 5120/10000 pages  812/s  ETA 6s  0 failed  mapping".
func progressLine(st *mapreduce.Status, elapsed time.Duration) string {
	done := st.Done + st.Failed
	if st.Total < 0 {
		return fmt.Sprintf("[%s] %d/? pages  %s  (splitting)", strings.Repeat("·", 30), done, rate(done, elapsed))
	}
	frac := 1.0
	if st.Total > 0 {
		frac = float64(done) / float64(st.Total)
	}
	filled := int(frac * 30)
	eta := "—"
	if r := float64(done) / elapsed.Seconds(); r > 0 && done < st.Total {
		eta = time.Duration(float64(st.Total-done) / r * float64(time.Second)).Round(time.Second).String()
	}
	return fmt.Sprintf("[%s%s] %d/%d pages  %s  ETA %s  %d failed  %s",
		strings.Repeat("#", filled), strings.Repeat("·", 30-filled), done, st.Total, rate(done, elapsed), eta, st.Failed, st.State)
}

func rate(n int, elapsed time.Duration) string {
	if elapsed <= 0 {
		return "0/s"
	}
	return fmt.Sprintf("%.0f/s", float64(n)/elapsed.Seconds())
}
