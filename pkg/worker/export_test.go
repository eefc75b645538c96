package worker

import (
	"net"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// WithClock returns cfg with the worker's clock replaced by now, as a host
// with a skewed clock would have it.
func WithClock(cfg Config, now func() time.Time) Config {
	cfg.now = now
	return cfg
}

// WithMetricsListener returns cfg with the worker serving its metrics and
// health endpoints on ln, in place of Config.MetricsAddr.
func WithMetricsListener(cfg Config, ln net.Listener) Config {
	cfg.metricsListener = ln
	return cfg
}

// WithLimitChecks returns cfg with the worker reading its semaphores'
// limits every d.
func WithLimitChecks(cfg Config, d time.Duration) Config {
	cfg.limitCheckEvery = d
	return cfg
}

// AsynqLevel is the asynq.LogLevel a worker with log gives asynq.
var AsynqLevel = asynqLevel

// Command runs the worker command named "w" on args in-process, as
// MainWith does, and returns its stdout, stderr and exit status.
func Command(args []string, jobs ...mapreduce.AnyJob) (string, string, int) {
	var stdout, stderr strings.Builder
	code := app.Exit("w", command("w", args, &stdout, &stderr, nil, jobs), &stderr)
	return stdout.String(), stderr.String(), code
}
