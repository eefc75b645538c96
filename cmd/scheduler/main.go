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
	"os"
	"os/signal"
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
	if len(os.Args) < 2 {
		app.Usage("missing command")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	switch cmd {
	case "serve":
		code = serve(ctx, args)
	case "jobs":
		code = jobs(ctx, args)
	case "run":
		code = run(ctx, args)
	case "status":
		code = status(ctx, args)
	case "runs":
		code = runs(ctx, args)
	case "cancel":
		code = cancel(ctx, args)
	case "retry":
		code = retry(ctx, args)
	case "permits":
		code = permits(ctx, args)
	case "ui":
		code = ui(ctx, args)
	case "-h", "--help", "-help", "help":
		fmt.Print(usage)
	case "version", "--version", "-version":
		fmt.Printf("scheduler: batchmr %s, %s\n", app.BuildVersion(), runtime.Version())
	default:
		if strings.HasPrefix(cmd, "-") {
			app.Usage("unknown command %q: the command comes first and its flags after it, e.g. scheduler jobs --redis-url redis://host:6379/0", cmd)
		}
		app.Usage("unknown command %q", cmd)
	}
	os.Exit(code)
}
