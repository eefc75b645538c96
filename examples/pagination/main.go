// Command pagination is batchmr's example: a report over a large Postgres
// table, split into keyset pages that a fleet of workers aggregates under
// the fleet-wide database semaphore. The job itself is in ordersreport;
// cmd/worker runs it and cmd/scheduler starts it. It imports only public
// packages: copy it as a template.
//
//	go run ./examples/pagination seed --rows 1000000   # create and fill orders
//	worker &  worker &  worker &                       # three workers (cmd/worker)
//	scheduler run orders-report --wait                 # run the job, watch it
//	go run ./examples/pagination check RUN             # compare with one SQL query
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
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
		usageError("missing command: seed or check")
	}
	ctx := context.Background()
	fs := flag.NewFlagSet(os.Args[1], flag.ContinueOnError)
	// No default from the environment: --help would print it, password
	// and all.
	dbURL := fs.String("database-url", "", "Postgres URL (default: env DATABASE_URL)")
	redisURL := fs.String("redis-url", "", "Redis URL, for check (default: env REDIS_URL)")
	rows := fs.Int("rows", 1_000_000, "orders to create, for seed")
	switch os.Args[1] {
	case "seed":
		parse(fs, os.Args[2:], dbURL, redisURL)
		if fs.NArg() > 0 {
			usageError("unexpected argument %q", fs.Arg(0))
		}
		pool, err := connectPostgres(ctx, *dbURL, "batchmr-seed")
		if err != nil {
			fail("%v", err)
		}
		defer pool.Close()
		start := time.Now()
		if err := ordersreport.Seed(ctx, pool, *rows); err != nil {
			fail("%v", err)
		}
		fmt.Printf("seeded %d orders in %s\n", *rows, time.Since(start).Round(time.Millisecond))
	case "check":
		parse(fs, os.Args[2:], dbURL, redisURL)
		if fs.NArg() != 1 {
			usageError("check takes one RUN")
		}
		os.Exit(check(ctx, *dbURL, *redisURL, fs.Arg(0)))
	case "-h", "--help", "help":
		fmt.Print(usage)
		fs.SetOutput(os.Stdout)
		fs.PrintDefaults()
	default:
		usageError("unknown command %q: use seed or check", os.Args[1])
	}
}

// redisClient returns a client of redisURL in go-redis's three forms:
// master_name= names a primary behind Sentinels, addr= a Cluster's seeds,
// neither one server.
func redisClient(redisURL string) (redis.UniversalClient, error) {
	u, err := url.Parse(redisURL)
	if err != nil {
		return nil, err
	}
	switch q := u.Query(); {
	case q.Has("master_name"):
		opt, err := redis.ParseFailoverURL(redisURL)
		if err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(opt), nil
	case q.Has("addr"):
		opt, err := redis.ParseClusterURL(redisURL)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opt), nil
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opt), nil
}

// check compares a succeeded run's report with the SQL aggregate.
func check(ctx context.Context, dbURL, redisURL, run string) int {
	pool, err := connectPostgres(ctx, dbURL, "batchmr-check")
	if err != nil {
		fail("%v", err)
	}
	defer pool.Close()
	if redisURL == "" {
		usageError("no Redis: pass --redis-url or set REDIS_URL")
	}
	rdb, err := redisClient(redisURL)
	if err != nil {
		// Not err: go-redis quotes the whole URL, password and all.
		fail("--redis-url (env REDIS_URL) is not a Redis URL: give redis://[user:password@]host:port/db, " +
			"redis://host:port?addr=host2:port2 (Cluster) or redis://sentinel:26379/db?master_name=NAME (Sentinel)")
	}
	defer rdb.Close()
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: env("BATCHMR_PREFIX", "")})
	if err != nil {
		fail("%v", err)
	}
	st, err := mr.Status(ctx, run)
	if err != nil {
		fail("%v", err)
	}
	if st.State != mapreduce.StateSucceeded {
		fail("run %s is %s, not succeeded: %s", run, st.State, st.Error)
	}
	rep, err := ordersreport.Job.Result(st)
	if err != nil {
		fail("%v", err)
	}
	want, err := ordersreport.Expected(ctx, pool)
	if err != nil {
		fail("%v", err)
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

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pagination: %s\n", fmt.Sprintf(format, args...))
	os.Exit(1)
}

func usageError(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pagination: %s (see --help)\n", fmt.Sprintf(format, args...))
	os.Exit(2)
}

// parse parses the flags, then gives the URLs left empty their
// environment variables.
func parse(fs *flag.FlagSet, args []string, dbURL, redisURL *string) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Print(usage)
		fs.SetOutput(os.Stdout)
		fs.PrintDefaults()
		os.Exit(0)
	} else if err != nil {
		usageError("%v", err)
	}
	if *dbURL == "" {
		*dbURL = env("DATABASE_URL", "")
	}
	if *redisURL == "" {
		*redisURL = env("REDIS_URL", "")
	}
}

func connectPostgres(ctx context.Context, url, appName string) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("no database: pass --database-url or set DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("postgres at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}
