// Command worker runs batchmr's jobs: an asynq server hosting the bundled
// jobs, whose every database query takes a permit of the fleet-wide
// semaphore "db".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
)

const usage = `worker runs batchmr jobs: it takes pages from Redis (asynq), queries
Postgres under the fleet-wide semaphore "db", and records the results.

Usage:
  worker [flags]

Example:
  REDIS_URL=redis://localhost:6379/0 DATABASE_URL=postgres://app@localhost/shop \
    worker --concurrency 20 --db-permits 8

Start as many workers as you like: together they never run more than the
semaphore's limit of queries at once. --db-permits sets that limit only if
Redis has none; change it live with 'scheduler permits set db N'.
SIGTERM or SIGINT: stop taking pages, let in-flight ones finish (or hand
them back after --shutdown-timeout), release permits, exit 0.
`

func main() {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	redisURL := fs.String("redis-url", app.Env("REDIS_URL", ""), "Redis URL (env REDIS_URL)")
	dbURL := fs.String("database-url", app.Env("DATABASE_URL", ""), "Postgres URL (env DATABASE_URL)")
	concurrency := fs.Int("concurrency", app.EnvInt("WORKER_CONCURRENCY", 10), "pages processed at once by this worker (env WORKER_CONCURRENCY)")
	queues := fs.String("queues", app.Env("WORKER_QUEUES", app.Queue), "asynq queues to serve, comma-separated, each optionally =priority (env WORKER_QUEUES)")
	appName := fs.String("application-name", app.Env("WORKER_APPLICATION_NAME", "batchmr-worker"), "application_name of the worker's database connections, as pg_stat_activity shows them")
	permits := fs.Int("db-permits", app.EnvInt("DB_PERMITS", 8), "the fleet's concurrent database queries, used only if Redis has no limit yet (env DB_PERMITS)")
	lease := fs.Duration("lease", app.EnvDuration("DB_PERMIT_LEASE", 30*time.Second), "how long a crashed worker's permit stays taken (env DB_PERMIT_LEASE)")
	shutdown := fs.Duration("shutdown-timeout", app.EnvDuration("WORKER_SHUTDOWN_TIMEOUT", 30*time.Second), "on SIGTERM, how long in-flight pages may finish before they are handed back")
	reconcile := fs.Duration("reconcile-every", 30*time.Second, "how often to repair runs left behind by crashes")
	poll := fs.Duration("poll-interval", app.EnvDuration("WORKER_POLL_INTERVAL", time.Second), "how often an idle worker looks for new tasks; lower starts steps sooner at the cost of Redis calls (env WORKER_POLL_INTERVAL)")
	logFormat := fs.String("log-format", app.Env("LOG_FORMAT", "text"), "text or json (env LOG_FORMAT)")
	logLevel := fs.String("log-level", app.Env("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	app.Parse(fs, usage+app.EnvHelp+"\nFlags:\n", os.Args[1:])
	if fs.NArg() > 0 {
		app.Usage("unexpected argument %q", fs.Arg(0))
	}
	log, err := app.Logger(*logFormat, *logLevel)
	if err != nil {
		app.Usage("%v", err)
	}
	if *concurrency < 1 {
		app.Usage("--concurrency %d: use at least 1", *concurrency)
	}
	qs, err := parseQueues(*queues)
	if err != nil {
		app.Usage("%v", err)
	}

	// A SIGTERM while connecting is a clean stop too; once the server runs,
	// asynq handles the signals itself.
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	stopping := func(err error) {
		if ctx.Err() != nil {
			log.Info("worker: stopped before starting")
			os.Exit(0)
		}
		app.Fail("%v", err)
	}
	rdb, err := app.Redis(ctx, *redisURL)
	if err != nil {
		stopping(err)
	}
	defer rdb.Close()
	// A connection per page at work, and a few for the split and reduce.
	pool, err := app.Postgres(ctx, *dbURL, *appName, *concurrency+4)
	if err != nil {
		stopping(err)
	}
	defer pool.Close()
	sem, err := app.Semaphore(rdb, app.SemaphoreName, semaphore.Options{Limit: *permits, Lease: *lease, Logger: log})
	if err != nil {
		app.Usage("%v", err)
	}
	defer sem.Close()
	jobs, err := app.Jobs(ctx, pool, sem)
	if err != nil {
		stopping(err)
	}
	mr, err := app.MapReduce(rdb, jobs, log)
	if err != nil {
		app.Fail("%v", err)
	}
	// From here on asynq's Run handles SIGTERM and SIGINT; ctx only stops
	// the reconciler.
	cancel()
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go mr.RunReconciler(ctx, *reconcile)

	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:       *concurrency,
		TaskCheckInterval: *poll,
		Queues:            qs,
		RetryDelayFunc:    mr.RetryDelay,
		ShutdownTimeout:   *shutdown,
		Logger:            asynqLogger{log},
		LogLevel:          asynq.WarnLevel,
	})
	mux := asynq.NewServeMux()
	mr.Register(mux)
	log.Info("worker: started", "concurrency", *concurrency, "queues", *queues, "jobs", jobs.Names(), "db_permits_default", *permits)
	// Run returns after SIGTERM or SIGINT, once in-flight pages finished or
	// were handed back to the queue.
	if err := srv.Run(mux); err != nil {
		app.Fail("%v", err)
	}
	cancel()
	log.Info("worker: stopped")
}

// parseQueues reads "a,b=3" into asynq's queue priorities.
func parseQueues(s string) (map[string]int, error) {
	qs := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		name, prio, hasPrio := strings.Cut(strings.TrimSpace(part), "=")
		if name == "" {
			return nil, fmt.Errorf("--queues %q: an empty queue name", s)
		}
		p := 1
		if hasPrio {
			n, err := strconv.Atoi(prio)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--queues %q: priority %q of %s is not a positive number", s, prio, name)
			}
			p = n
		}
		qs[name] = p
	}
	return qs, nil
}
