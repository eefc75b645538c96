package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

const cancelUsage = `scheduler cancel RUN: stop a run. Queued pages do not start, pages at work
see their context cancelled, the reduce does not run. Cancelling a
cancelled run does nothing; a run that already succeeded or failed exits 1.

Example:
  scheduler cancel orders-report:20261121T060000Z

Flags:
`

func cancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	c, id, err := connectForRun(ctx, fs, url, cancelUsage, args, stdout, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.mr.Cancel(ctx, id); err != nil {
		return errors.New(trim(err))
	}
	fmt.Fprintln(stdout, "cancelled", id)
	return nil
}
