package worker

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

const usage = `%[1]s runs batchmr jobs (%[2]s): it takes their pages from Redis (asynq),
runs them, records the results, and takes a permit of a fleet-wide
semaphore before each database query.

Usage:
  %[1]s [flags]

Example:
  REDIS_URL=redis://localhost:6379/0 DATABASE_URL=postgres://app@localhost/shop \
    %[1]s --concurrency 20 --db-permits 8 --metrics-addr 127.0.0.1:9090

Start as many workers as you like, on as many machines: together they never
run more than a semaphore's limit of queries at once. --db-permits and
--permits set a limit only if Redis has none yet; change it live with
'scheduler permits set db N'. Start runs with 'scheduler run JOB': the
worker announces its jobs, so the scheduler needs no rebuild.
--metrics-addr serves Prometheus /metrics (the whole fleet's semaphores and
runs, and this worker's own work), /healthz and /readyz (docs/metrics.md).
SIGTERM or SIGINT: stop taking tasks, let in-flight ones finish (or hand
them back after --shutdown-timeout), release permits, exit 0.

Logs go to stderr, one record a line: --log-format json for a log
collector. Records of a page carry its run, job, step, page, attempt and
task; asynq's own carry component=asynq. --log-level warn keeps only what
needs a look; debug adds a line per page and asynq's internals.

Environment: every flag has the variable named in its description;
BATCHMR_PREFIX (default batchmr) starts every Redis key and queue name of a
deployment, so several share one Redis.

Flags:
`

// Main runs jobs as a worker process: it reads the flags and their
// environment variables (--help lists them), runs until SIGTERM or SIGINT,
// and exits: 0 after a clean shutdown, 2 for a bad command line, 1 when it
// cannot start (an unreachable server, an invalid job), each with one line
// on stderr that names the problem and the fix. It is the whole main
// function of a worker binary:
//
//	func main() { worker.Main(countkinds.Job, nightly.Job) }
func Main(jobs ...mapreduce.AnyJob) { MainWith(nil, jobs...) }

// MainWith is Main for a binary that sets what no flag does, such as an
// Observer for tracing: configure, if not nil, is called with the Config
// that the command line and environment gave, before the worker starts,
// and may change it. Every flag keeps working, and MainWith returns after
// a clean shutdown (and after --help or --version), so that main's
// deferred calls (flushing spans) run; any other outcome exits:
//
//	worker.MainWith(func(cfg *worker.Config) {
//		cfg.Observer = mrotel.New(mrotel.Options{TracerProvider: tp})
//	}, countkinds.Job)
func MainWith(configure func(*Config), jobs ...mapreduce.AnyJob) {
	name := filepath.Base(os.Args[0])
	err := command(name, os.Args[1:], os.Stdout, os.Stderr, configure, jobs)
	if code := app.Exit(name, err, os.Stderr); code != 0 {
		os.Exit(code)
	}
}

// command is the worker command named name, with args its command line:
// it returns nil after a clean shutdown, --help or --version, a
// *app.UsageError for a bad command line and another error when the
// worker cannot start, each message without the "worker: " prefix that
// name replaces.
func command(name string, args []string, stdout, stderr io.Writer, configure func(*Config), jobs []mapreduce.AnyJob) error {
	cfg, err := configFromFlags(name, args, jobs, stdout, stderr)
	if err != nil {
		return err
	}
	if configure != nil {
		configure(&cfg)
	}
	// Checked once, after configure, which may set what the flags left
	// out (a RedisURL of its own) or ask for more (RequireDatabase): a
	// missing setting exits 2 with its fix, whichever gave it.
	if err := cfg.withDefaults().validate(); err != nil {
		return app.Usagef("%v", strings.TrimPrefix(err.Error(), "worker: "))
	}
	// A SIGTERM while connecting is a clean stop too.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	w, err := start(ctx, cfg, jobs)
	if err != nil {
		if ctx.Err() != nil {
			cfg.Logger.Info("worker: stopped before starting")
			return nil // exit 0, after main's deferred calls
		}
		return errors.New(strings.TrimPrefix(err.Error(), "worker: "))
	}
	<-ctx.Done()
	stop() // a second signal kills the process at once
	w.stop()
	return nil
}

// configFromFlags parses the command line into a Config. It returns
// flag.ErrHelp after printing --help or --version on stdout, and a
// *app.UsageError naming the fix for a bad flag or environment variable.
func configFromFlags(name string, args []string, jobs []mapreduce.AnyJob, stdout, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cfg Config
	f, err := defineFlags(fs, &cfg)
	if err != nil {
		return cfg, err
	}
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.JobName()
	}
	if err := app.Parse(fs, fmt.Sprintf(usage, name, strings.Join(names, ", ")), args, stdout); err != nil {
		return cfg, err
	}
	if *f.version {
		fmt.Fprintf(stdout, "%s: batchmr %s, %s\n", name, app.BuildVersion(), runtime.Version())
		return cfg, flag.ErrHelp // printed what was asked: exit 0
	}
	if fs.NArg() > 0 {
		return cfg, app.Usagef("unexpected argument %q", fs.Arg(0))
	}
	err = f.complete(&cfg, names, stderr)
	return cfg, err
}

// workerFlags holds the flags' values that are not Config's fields as
// they are given.
type workerFlags struct {
	redisTLS            app.RedisTLS
	dbPermits           *int
	permits, weights    app.StringList
	version             *bool
	logFormat, logLevel *string
}

// defineFlags defines the worker's flags on fs, setting cfg's fields or
// the returned workerFlags. It returns the first malformed environment
// variable's error: it would be the flag's default.
func defineFlags(fs *flag.FlagSet, cfg *Config) (*workerFlags, error) {
	var envErr error
	envInt := func(name string, def int) int {
		n, err := app.EnvInt(name, def)
		envErr = cmp.Or(envErr, err)
		return n
	}
	envDuration := func(name string, def time.Duration) time.Duration {
		d, err := app.EnvDuration(name, def)
		envErr = cmp.Or(envErr, err)
		return d
	}
	f := &workerFlags{}
	fs.StringVar(&cfg.RedisURL, "redis-url", app.Env("REDIS_URL", ""), "Redis URL: redis://host:port/db, redis://host:port?addr=host2:port2 (Cluster) or redis://sentinel:26379/db?master_name=NAME (Sentinel); rediss:// for TLS (env REDIS_URL)")
	envErr = f.redisTLS.AddFlags(fs)
	fs.StringVar(&cfg.DatabaseURL, "database-url", app.Env("DATABASE_URL", ""), "Postgres URL; none: the jobs get no database (env DATABASE_URL)")
	fs.IntVar(&cfg.Concurrency, "concurrency", envInt("WORKER_CONCURRENCY", 10), "tasks run at once by this worker (env WORKER_CONCURRENCY)")
	fs.StringVar(&cfg.ApplicationName, "application-name", app.Env("WORKER_APPLICATION_NAME", "batchmr-worker"), "application_name of the database connections, as pg_stat_activity shows them (env WORKER_APPLICATION_NAME)")
	f.dbPermits = fs.Int("db-permits", envInt("DB_PERMITS", 8), `the fleet's concurrent database queries (semaphore "db"), used only if Redis has no limit yet (env DB_PERMITS)`)
	f.permits = app.StringList(splitList(app.Env("WORKER_PERMITS", "")))
	fs.Var(&f.permits, "permits", "NAME=N: open the fleet-wide semaphore NAME with N permits if Redis has no limit yet; repeatable (env WORKER_PERMITS, comma-separated)")
	f.weights = app.StringList(splitList(app.Env("WORKER_WEIGHTS", "")))
	fs.Var(&f.weights, "weight", "JOB=N: the priority of JOB's queue against the other jobs' (default 1); repeatable (env WORKER_WEIGHTS, comma-separated)")
	fs.DurationVar(&cfg.Lease, "lease", envDuration("DB_PERMIT_LEASE", 30*time.Second), "how long a crashed worker's permit stays taken (env DB_PERMIT_LEASE)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", envDuration("WORKER_SHUTDOWN_TIMEOUT", 30*time.Second), "on SIGTERM, how long in-flight tasks may finish before they are handed back (env WORKER_SHUTDOWN_TIMEOUT)")
	fs.DurationVar(&cfg.ReconcileEvery, "reconcile-every", envDuration("WORKER_RECONCILE_EVERY", 30*time.Second), "how often to repair runs left behind by crashes (env WORKER_RECONCILE_EVERY)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", envDuration("WORKER_POLL_INTERVAL", defaultPollInterval), "how often an idle worker looks for tasks: each step of a run that starts on idle workers waits for their next look; lower starts steps sooner, at a Redis call per queue per look (env WORKER_POLL_INTERVAL)")
	fs.DurationVar(&cfg.MaxClockOffset, "max-clock-offset", envDuration("WORKER_MAX_CLOCK_OFFSET", 3*time.Second), "how far this host's clock may be from Redis's before the worker refuses to start (env WORKER_MAX_CLOCK_OFFSET)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", app.Env("METRICS_ADDR", ""), "host:port to serve Prometheus /metrics, /healthz and /readyz on, e.g. 127.0.0.1:9090; empty: none (env METRICS_ADDR)")
	fs.StringVar(&cfg.Version, "version-label", app.Env("WORKER_VERSION", ""), "free text shown with this worker in 'scheduler jobs', e.g. a build ID; default: the batchmr version it was built with (env WORKER_VERSION)")
	f.version = fs.Bool("version", false, "print the batchmr version this worker was built with, and exit")
	f.logFormat = fs.String("log-format", app.Env("LOG_FORMAT", "text"), "text or json, on stderr (env LOG_FORMAT)")
	f.logLevel = fs.String("log-level", app.Env("LOG_LEVEL", "info"), "debug, info, warn or error: the least severe records logged, asynq's included (env LOG_LEVEL)")
	return f, envErr
}

// complete sets the fields of cfg that the parsed flags f give, and
// checks them: a *app.UsageError names the fix. names are the worker's
// jobs.
func (f *workerFlags) complete(cfg *Config, names []string, stderr io.Writer) error {
	cfg.RedisCAFile, cfg.RedisCertFile, cfg.RedisKeyFile = f.redisTLS.CAFile, f.redisTLS.CertFile, f.redisTLS.KeyFile
	cfg.RedisInsecureSkipVerify = f.redisTLS.InsecureSkipVerify
	// Their defaults are the flags' values: zero was given, and Config
	// would read it as "the default", silently.
	for _, d := range cfg.durations() {
		if d.v == 0 {
			return app.Usagef("%s 0 (env %s): use a positive duration, or leave it unset for the default (see --help)", d.flag, d.env)
		}
	}
	var err error
	if cfg.Logger, err = app.NewLogger(stderr, *f.logFormat, *f.logLevel); err != nil {
		return app.Usagef("%v", err)
	}
	if cfg.Concurrency < 1 {
		return app.Usagef("--concurrency %d: use at least 1", cfg.Concurrency)
	}
	cfg.Prefix = app.Prefix
	if cfg.Permits, err = parseCounts("--permits", f.permits); err != nil {
		return app.Usagef("%v", err)
	}
	if cfg.DatabaseURL != "" {
		if _, set := cfg.Permits[DBSemaphore]; !set {
			cfg.Permits[DBSemaphore] = *f.dbPermits
		}
	}
	if cfg.Weights, err = parseCounts("--weight", f.weights); err != nil {
		return app.Usagef("%v", err)
	}
	for job, n := range cfg.Weights {
		if !slices.Contains(names, job) {
			return app.Usagef("--weight %s=%d: this worker runs no job %q (it runs: %s)", job, n, job, strings.Join(names, ", "))
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// parseCounts reads NAME=N pairs.
func parseCounts(flagName string, pairs []string) (map[string]int, error) {
	out := map[string]int{}
	for _, p := range pairs {
		name, v, ok := strings.Cut(p, "=")
		n, err := strconv.Atoi(v)
		if !ok || name == "" || err != nil {
			return nil, fmt.Errorf("%s %q: use NAME=N, e.g. %s db=8", flagName, p, flagName)
		}
		out[name] = n
	}
	return out, nil
}
