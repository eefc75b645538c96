// Command pagination is batchmr's example: a report over a large Postgres
// table, split into keyset pages that a fleet of workers aggregates under
// the fleet-wide database semaphore. The job itself is in ordersreport;
// cmd/worker runs it and cmd/scheduler starts it.
//
//	go run ./examples/pagination seed --rows 1000000   # create and fill orders
//	worker &  worker &  worker &                       # three workers (cmd/worker)
//	scheduler run orders-report --wait                 # run the job, watch it
//	go run ./examples/pagination check RUN             # compare with one SQL query
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const usage = `pagination seeds the example's orders table and checks a report run.

Usage:
  pagination seed [--rows N]   create and fill orders (generate_series; 1M rows in seconds)
  pagination check RUN         compare RUN's report with the same aggregate in one SQL query

Examples:
  DATABASE_URL=postgres://app@localhost/shop go run ./examples/pagination seed --rows 1000000
  go run ./examples/pagination check orders-report:20261121T060000Z

Flags (both commands read --database-url, env DATABASE_URL; check also --redis-url, env REDIS_URL):
`

func main() {
	if len(os.Args) < 2 {
		app.Usage("missing command: seed or check")
	}
	ctx := context.Background()
	fs := flag.NewFlagSet(os.Args[1], flag.ContinueOnError)
	dbURL := fs.String("database-url", app.Env("DATABASE_URL", ""), "Postgres URL (env DATABASE_URL)")
	redisURL := fs.String("redis-url", app.Env("REDIS_URL", ""), "Redis URL (env REDIS_URL), for check")
	rows := fs.Int("rows", 1_000_000, "orders to create, for seed")
	switch os.Args[1] {
	case "seed":
		app.Parse(fs, usage, os.Args[2:])
		if fs.NArg() > 0 {
			app.Usage("unexpected argument %q", fs.Arg(0))
		}
		pool, err := app.Postgres(ctx, *dbURL, "batchmr-seed", 0)
		if err != nil {
			app.Fail("%v", err)
		}
		defer pool.Close()
		start := time.Now()
		if err := ordersreport.Seed(ctx, pool, *rows); err != nil {
			app.Fail("%v", err)
		}
		fmt.Printf("seeded %d orders in %s\n", *rows, time.Since(start).Round(time.Millisecond))
	case "check":
		app.Parse(fs, usage, os.Args[2:])
		if fs.NArg() != 1 {
			app.Usage("check takes one RUN")
		}
		os.Exit(check(ctx, *dbURL, *redisURL, fs.Arg(0)))
	case "-h", "--help", "help":
		fmt.Print(usage)
		fs.SetOutput(os.Stdout)
		fs.PrintDefaults()
	default:
		app.Usage("unknown command %q: use seed or check", os.Args[1])
	}
}

// check compares a succeeded run's report with the SQL aggregate.
func check(ctx context.Context, dbURL, redisURL, run string) int {
	pool, err := app.Postgres(ctx, dbURL, "batchmr-check", 0)
	if err != nil {
		app.Fail("%v", err)
	}
	defer pool.Close()
	rdb, mr := app.Client(ctx, redisURL)
	defer rdb.Close()
	st, err := mr.Status(ctx, run)
	if err != nil {
		app.Fail("%v", err)
	}
	if st.State != mapreduce.StateSucceeded {
		app.Fail("run %s is %s, not succeeded: %s", run, st.State, st.Error)
	}
	var rep ordersreport.Report
	if err := mr.DecodeResult(st, &rep); err != nil {
		app.Fail("%v", err)
	}
	want, err := ordersreport.Expected(ctx, pool)
	if err != nil {
		app.Fail("%v", err)
	}
	got, _ := json.Marshal(rep.Totals)
	exp, _ := json.Marshal(want)
	if !rep.Totals.Equal(want) {
		fmt.Printf("MISMATCH\n  run %s: %s\n  SQL:    %s\n", run, got, exp)
		return 1
	}
	fmt.Printf("OK: the report of %s (%d pages) equals SQL's: %s\n", run, rep.Pages, got)
	return 0
}
