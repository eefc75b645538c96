package worker

import "time"

// WithClock returns cfg with the worker's clock replaced by now, as a host
// with a skewed clock would have it.
func WithClock(cfg Config, now func() time.Time) Config {
	cfg.now = now
	return cfg
}

// AsynqLevel is the asynq.LogLevel a worker with log gives asynq.
var AsynqLevel = asynqLevel
