// Command scheduler starts and follows batchmr runs: on a schedule (serve),
// by hand (run), and inspects, lists and cancels them; it also shows and
// sets the fleet's database permits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/batchmr/batchmr/internal/app"
)

const usage = `scheduler starts, follows and cancels batchmr runs, and tunes the fleet's
database permits.

Usage:
  scheduler serve --schedule JOB=SPEC [--schedule ...] [--args JOB=JSON ...]
  scheduler run JOB [--args JSON] [--key KEY] [--wait]
  scheduler status RUN [--json]
  scheduler runs [JOB]
  scheduler cancel RUN
  scheduler permits get NAME
  scheduler permits set NAME N

Examples:
  scheduler serve --schedule 'orders-report=@every 10m'
  scheduler run orders-report --args '{"slow_ms": 50}' --wait
  scheduler permits set db 12

Every command reads --redis-url (env REDIS_URL); 'scheduler COMMAND --help'
says more.
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
	case "run":
		code = run(ctx, args)
	case "status":
		code = status(ctx, args)
	case "runs":
		code = runs(ctx, args)
	case "cancel":
		code = cancel(ctx, args)
	case "permits":
		code = permits(ctx, args)
	case "-h", "--help", "-help", "help":
		fmt.Print(usage)
	default:
		app.Usage("unknown command %q", cmd)
	}
	os.Exit(code)
}
