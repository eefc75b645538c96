package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/batchmr/batchmr/internal/app"
)

const cancelUsage = `scheduler cancel RUN: stop a run. Queued pages do not start, pages at work
see their context cancelled, the reduce does not run. Cancelling a
cancelled run does nothing; a run that already succeeded or failed exits 1.

Example:
  scheduler cancel orders-report:20261121T060000Z

Flags:
`

func cancel(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	url := redisFlag(fs)
	pos := parse(fs, cancelUsage, args)
	want(pos, 1, 1, "RUN (a run ID, as 'scheduler run' or 'scheduler runs' print it)")
	c := connect(ctx, *url)
	defer c.close()
	if err := c.mr.Cancel(ctx, pos[0]); err != nil {
		app.Fail("%s", trim(err))
	}
	fmt.Println("cancelled", pos[0])
	return 0
}
