package worker

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// defaultPollInterval is Config.PollInterval's default.
const defaultPollInterval = mapreduce.DefaultPollInterval

// Config configures a worker. In Main every field has a command-line flag
// and an environment variable, but Prefix (BATCHMR_PREFIX only), Logger
// (built from --log-format and --log-level), and Observer,
// RequireDatabase and RedisTLSConfig (set them with MainWith, or call
// Run); zero values take the documented defaults.
type Config struct {
	// RedisURL locates the Redis that holds runs, tasks and semaphores
	// (--redis-url, REDIS_URL), in one of three forms. Required.
	//   - one server: redis://[user:password@]host:port/db (rediss://
	//     for TLS, unix:///path/redis.sock); a server in cluster mode is
	//     used as a Cluster's seed
	//   - Redis Cluster: redis://host:port?addr=host2:port2&addr=host3:port3
	//     (no /db: a Cluster has only database 0)
	//   - Sentinel: redis://sentinel:26379/db?master_name=NAME&addr=sentinel2:26379
	//     (user:password@ is the Sentinels'; password= the primary's)
	// The TLS settings below apply to all three.
	RedisURL string
	// RedisCAFile is a PEM file of the CA that signed the certificate of
	// a rediss:// RedisURL's server (--redis-ca-file, REDIS_CA_FILE).
	// Empty: the system's CAs.
	RedisCAFile string
	// RedisCertFile and RedisKeyFile are the PEM files of the worker's
	// client certificate and its key, for a Redis that requires one
	// (tls-auth-clients yes) (--redis-cert-file, REDIS_CERT_FILE;
	// --redis-key-file, REDIS_KEY_FILE). Both or neither.
	RedisCertFile, RedisKeyFile string
	// RedisInsecureSkipVerify accepts any certificate from Redis, so
	// that anyone on the path can read and change the traffic; the worker
	// logs a warning when it starts (--redis-insecure-skip-verify,
	// REDIS_INSECURE_SKIP_VERIFY). A RedisURL's skip_verify=true is
	// refused without it. For tests only.
	RedisInsecureSkipVerify bool
	// RedisTLSConfig, if not nil, is the TLS configuration of a rediss://
	// RedisURL's connections to start from, for what no file gives (a
	// certificate held in memory, say); the worker clones it and adds the
	// files above. Its ServerName defaults to the URL's host. Nil: Go's
	// defaults.
	RedisTLSConfig *tls.Config
	// DatabaseURL locates the Postgres the jobs query (--database-url,
	// DATABASE_URL); over TLS, give it sslmode=verify-full and
	// sslrootcert=FILE (the worker warns of a remote host's URL that may
	// connect without TLS). Empty: the worker has no database, and
	// worker.Database hands the steps that call it back to the queue.
	DatabaseURL string
	// RequireDatabase makes the worker refuse to start without a
	// DatabaseURL. Set it (worker.MainWith) when the jobs query Postgres:
	// a worker started without one would take pages only to hand them
	// back, each offered again 2.5–7.5 s later, which slows the runs it
	// shares with healthy workers (and stalls them if no worker has a
	// database). Without it, such a worker starts with a warning.
	RequireDatabase bool
	// ApplicationName names the worker's database connections in
	// pg_stat_activity (--application-name, WORKER_APPLICATION_NAME).
	// Default "batchmr-worker".
	ApplicationName string
	// Prefix starts every Redis key and queue name of the deployment
	// (BATCHMR_PREFIX). Default "batchmr".
	Prefix string
	// Concurrency is how many tasks the worker runs at once
	// (--concurrency, WORKER_CONCURRENCY). Default 10.
	Concurrency int
	// Permits opens fleet-wide semaphores by name, each with the limit it
	// gets if Redis has none yet; Redis holds the live limit, which
	// 'scheduler permits set' changes (--permits NAME=N, WORKER_PERMITS;
	// --db-permits N, DB_PERMITS, for "db"). Default: "db" with 8 when the
	// worker has a database.
	Permits map[string]int
	// Lease is how long a permit of a crashed worker stays taken
	// (--lease, DB_PERMIT_LEASE). Default 30s.
	Lease time.Duration
	// ShutdownTimeout is how long in-flight tasks may finish after SIGTERM
	// before they are handed back (--shutdown-timeout,
	// WORKER_SHUTDOWN_TIMEOUT). Default 30s.
	ShutdownTimeout time.Duration
	// ReconcileEvery is how often the worker repairs runs that crashes left
	// behind (--reconcile-every, WORKER_RECONCILE_EVERY). Default 30s.
	ReconcileEvery time.Duration
	// PollInterval is how often an idle worker looks for tasks
	// (--poll-interval, WORKER_POLL_INTERVAL). Default 100ms: each step of
	// a run that starts on idle workers (the split, the reduce) waits for
	// their next look; an idle worker costs Redis ~0.2% of a core for 8
	// queues (BENCHMARKS.md, "The worker's default poll interval").
	PollInterval time.Duration
	// Weights sets the priority of each job's queue against the others'
	// (--weight JOB=N, WORKER_WEIGHTS). Default 1 each.
	Weights map[string]int
	// MaxClockOffset is how far this host's clock may be from Redis's
	// before the worker refuses to start (--max-clock-offset,
	// WORKER_MAX_CLOCK_OFFSET): asynq leases tasks and schedules retries on
	// the worker's clock. A running worker checks again every minute and
	// logs an error when its clock has drifted past it. Default 3s.
	MaxClockOffset time.Duration
	// MetricsAddr is the host:port on which the worker serves Prometheus
	// metrics on /metrics, liveness on /healthz (200 while the process
	// runs, through Redis and database outages) and readiness on /readyz
	// (200 when Redis, and the database if the worker has one, answer a
	// ping within 1s; 503 naming what failed otherwise) (--metrics-addr,
	// METRICS_ADDR). docs/metrics.md lists the metrics. Empty: none of
	// them is served. The endpoints have no authentication: listen on
	// loopback or a private network, e.g. 127.0.0.1:9090.
	MetricsAddr string
	// Version is free text shown with the worker in 'scheduler jobs'
	// (--version-label, WORKER_VERSION). Default: "batchmr" and the
	// version of batchmr the binary was built with.
	Version string
	// Observer also learns of every step this worker runs and every run
	// it ends, besides the worker's own metrics: for tracing, give it
	// mrotel.New(mrotel.Options{...}) (package
	// github.com/batchmr/batchmr/pkg/mapreduce/mrotel). Nil: none.
	Observer mapreduce.Observer
	// Logger receives the worker's logs, asynq's included, at the levels
	// its handler enables (--log-level, LOG_LEVEL; --log-format,
	// LOG_FORMAT). A job's functions get it with the step's attributes
	// from Logger(ctx). asynq's records carry component=asynq, and asynq
	// logs at the lowest of debug, info, warn and error that the handler
	// enables when the worker starts. Default: slog.Default() (Main: text
	// on stderr at info level). docs/operations.md lists what is logged
	// at which level, and the attribute keys.
	Logger *slog.Logger

	now             func() time.Time // the worker's clock; tests skew it (export_test.go)
	metricsListener net.Listener     // overrides MetricsAddr; tests listen on a free port (export_test.go)
	limitCheckEvery time.Duration    // how often watchLimits reads the limits; tests shorten it (export_test.go)
}

// redisTLS is the worker's Redis TLS settings, as app.Redis takes them.
func (c Config) redisTLS() app.RedisTLS {
	return app.RedisTLS{CAFile: c.RedisCAFile, CertFile: c.RedisCertFile, KeyFile: c.RedisKeyFile,
		InsecureSkipVerify: c.RedisInsecureSkipVerify, Config: c.RedisTLSConfig}
}

func (c Config) withDefaults() Config {
	if c.ApplicationName == "" {
		c.ApplicationName = "batchmr-worker"
	}
	if c.Prefix == "" {
		c.Prefix = "batchmr"
	}
	if c.Concurrency == 0 {
		c.Concurrency = 10
	}
	if c.Permits == nil && c.DatabaseURL != "" {
		c.Permits = map[string]int{DBSemaphore: 8}
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.ReconcileEvery == 0 {
		c.ReconcileEvery = 30 * time.Second
	}
	if c.MaxClockOffset == 0 {
		c.MaxClockOffset = 3 * time.Second
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.limitCheckEvery == 0 {
		c.limitCheckEvery = limitCheckEvery
	}
	if c.PollInterval == 0 {
		c.PollInterval = defaultPollInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// duration is one of Config's durations, with its flag, its environment
// variable and the least it may be (zero meaning the default).
type duration struct {
	flag, env string
	v, min    time.Duration
}

// durations lists Config's durations, for validate and for the command
// line's own check of explicit zeros.
func (c Config) durations() []duration {
	return []duration{
		{"--lease", "DB_PERMIT_LEASE", c.Lease, time.Second},
		{"--shutdown-timeout", "WORKER_SHUTDOWN_TIMEOUT", c.ShutdownTimeout, 0},
		{"--reconcile-every", "WORKER_RECONCILE_EVERY", c.ReconcileEvery, time.Second},
		{"--poll-interval", "WORKER_POLL_INTERVAL", c.PollInterval, time.Millisecond},
		{"--max-clock-offset", "WORKER_MAX_CLOCK_OFFSET", c.MaxClockOffset, 100 * time.Millisecond},
	}
}

// validate names the field and the flag of every bad value.
func (c Config) validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if c.RedisURL == "" {
		bad("no Redis: pass --redis-url or set REDIS_URL (Config.RedisURL), e.g. redis://localhost:6379/0")
	} else if _, err := app.RedisOptions(c.RedisURL, c.redisTLS()); err != nil {
		// A malformed URL, an unreadable certificate or an unsanctioned
		// skip_verify: a bad command line, not a failed start.
		bad("%v", err)
	}
	if c.RequireDatabase && c.DatabaseURL == "" {
		bad("no database: pass --database-url or set DATABASE_URL (Config.DatabaseURL): this worker's jobs query Postgres")
	}
	if c.Concurrency < 0 {
		bad("--concurrency %d: use at least 1 (Config.Concurrency)", c.Concurrency)
	}
	for _, d := range c.durations() {
		if d.v < 0 {
			bad("%s %v is negative: use a positive duration such as 30s, or leave it unset for the default", d.flag, d.v)
		} else if d.v > 0 && d.v < d.min {
			bad("%s %v: use at least %v", d.flag, d.v, d.min)
		}
	}
	names := make([]string, 0, len(c.Permits))
	for name := range c.Permits {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if n := c.Permits[name]; n < 1 || n > semaphore.MaxLimit {
			flag := "--permits " + name + "="
			if name == DBSemaphore {
				flag = "--db-permits "
			}
			bad("%s%d: a semaphore needs at least 1 permit and takes at most %d (Config.Permits)", flag, n, semaphore.MaxLimit)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("worker: %s", strings.Join(errs, "; "))
	}
	return nil
}
