// Command scheduler starts and follows runs of any batchmr job: on a
// schedule (serve), by hand (run); it lists the jobs workers announce
// (jobs), inspects, lists, cancels and resumes runs, and shows and sets
// the fleet's semaphores (permits); it serves a web console of all that
// (ui). It is built with no job: every job it knows comes
// from the catalogue in Redis, which workers fill as they start.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/batchmr/batchmr/internal/app"
	// The time zones of CRON_TZ= schedules, in images without zoneinfo
	// (the distroless one).
	_ "time/tzdata"
)

const usage = `scheduler starts, follows, cancels and resumes runs of any batchmr job, and
tunes the fleet's semaphores. It knows the jobs that workers announce in
Redis (the catalogue): a new job needs a worker that runs it, never a new
scheduler.

Usage:
  scheduler jobs [--json]
  scheduler jobs forget JOB
  scheduler run JOB [--args JSON] [--key KEY] [--wait]
  scheduler serve --schedule JOB=SPEC [--schedule ...] [--args JOB=JSON ...]
  scheduler status RUN [--json]
  scheduler runs [JOB] [--state STATE]
  scheduler cancel RUN
  scheduler retry RUN [--wait]
  scheduler permits get [NAME] [--verbose]
  scheduler permits set NAME N [--new]
  scheduler permits auto NAME --min A --max B [--fixed N] [--shadow] [--new]
  scheduler ui [--listen 127.0.0.1:8080] [--read-only] [--tls-cert FILE --tls-key FILE]
  scheduler version

Examples:
  scheduler jobs
  scheduler run orders-report --args '{"slow_ms": 50}' --wait
  scheduler serve --schedule 'orders-report=@every 10m'
  scheduler retry orders-report:20261121T060000Z --wait
  scheduler permits set db 12
  scheduler ui --read-only

Every command reads --redis-url (env REDIS_URL), and for a rediss:// URL
--redis-ca-file, --redis-cert-file and --redis-key-file (docs/operations.md,
TLS); 'scheduler COMMAND --help' says more. Exit status: 0 done, 1 failed
(the message says why and what to do), 2 bad command line, 130 stopped
following a run on Ctrl-C.
` + app.EnvHelp

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := Main(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is a subcommand: it runs args (its flags and arguments) until it
// is done or ctx is, writing on stdout and stderr, and returns its outcome
// for app.Exit: nil, a *app.UsageError (exit 2), an app.ExitCode it has
// reported itself, or another error (exit 1).
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

var commands = map[string]command{
	"serve":   serve,
	"jobs":    jobs,
	"run":     run,
	"status":  status,
	"runs":    runs,
	"cancel":  cancel,
	"retry":   retry,
	"permits": permits,
	"ui":      ui,
}

// Main runs the command line args (args[0] names the program, as in
// os.Args) until it is done or ctx is (SIGINT, SIGTERM), writing on stdout
// and stderr, and returns the exit status that the usage lists; an error
// is one line on stderr, the program's name and what to do. It never exits
// the process: tests run it in-process.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := "scheduler"
	if len(args) > 0 {
		name, args = filepath.Base(args[0]), args[1:]
	}
	return app.Exit(name, dispatch(ctx, args, stdout, stderr), stderr)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return app.Usagef("missing command")
	}
	cmd, args := args[0], args[1:]
	if c, ok := commands[cmd]; ok {
		return c(ctx, args, stdout, stderr)
	}
	switch cmd {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "scheduler: batchmr %s, %s\n", app.BuildVersion(), runtime.Version())
		return nil
	}
	if strings.HasPrefix(cmd, "-") {
		return app.Usagef("unknown command %q: the command comes first and its flags after it, e.g. scheduler jobs --redis-url redis://host:6379/0", cmd)
	}
	return app.Usagef("unknown command %q", cmd)
}
