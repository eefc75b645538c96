package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strings"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// outageOf returns the outage that err, a step's failed attempt, is a
// failure of, or "" for an error of the step's own: a transient error
// (IsTransient) that Postgres or Redis caused, not one the job marked
// with Transient (a rate limit of its own is its to log each time), nor
// a lost permit (the semaphore logs it).
func outageOf(err error) outage.Cause {
	var marked *transientMark
	if !IsTransient(err) || errors.As(err, &marked) || errors.Is(err, semaphore.ErrLeaseLost) {
		return ""
	}
	var redisErr redis.Error
	if errors.As(err, &redisErr) && rediserr.Transient(redisErr) {
		return outage.RedisFailover
	}
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) || outage.CauseOf(err) == outage.Database || fromPackage(err, "github.com/jackc/pgx/") {
		// IsTransient took its SQLSTATE for a connection failure, a
		// server shutting down or starting, too many connections (or a
		// conflict: a retry of the step's own, logged each time).
		if code := sqlState(err); code == "40001" || code == "40P01" {
			return ""
		}
		return outage.Database
	}
	return ""
}

// redisOutage is the outage of err, an error of Redis's that
// rediserr.Transient accepts: a failover's refusal (READONLY, LOADING, …)
// or Redis unreachable.
func redisOutage(err error) outage.Cause {
	var redisErr redis.Error
	if errors.As(err, &redisErr) {
		return outage.RedisFailover
	}
	return outage.Redis
}

// background is how a background loop of a Client's (the announcer, the
// reconciler) reports to the Client's outage log.
type background interface {
	backgroundFailed(err error, what string) bool
	backgroundAnswered(wrote bool)
}

var _ background = (*Client)(nil)

// backgroundFailed reports whether err, an error of a background loop
// of c's (the reconciler, the cancellation watch, the announcer), is a
// Redis outage's, which it then counts in c's outage log: its warning
// comes once per outage, not per loop and try. The loop logs any other
// error itself.
func (c *Client) backgroundFailed(err error, what string) bool {
	if !rediserr.Transient(err) {
		return false
	}
	c.outages.Failed(nil, redisOutage(err), "", err, slog.String("while", what))
	return true
}

// backgroundAnswered ends c's outage of Redis unreachable: a background
// loop got its answers; and, if wrote, that of a failover too.
func (c *Client) backgroundAnswered(wrote bool) {
	if !c.outages.Ongoing() {
		return
	}
	c.outages.Ended(outage.Redis, "")
	if wrote {
		c.outages.Ended(outage.RedisFailover, "")
	}
}

// sqlState is the SQLSTATE err carries, or "".
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

// fromPackage reports whether an error in err's tree is of a type of a
// package whose path begins with prefix: pgx's connection errors carry no
// SQLSTATE, and mapreduce recognises them without importing pgx.
func fromPackage(err error, prefix string) bool {
	if err == nil {
		return false
	}
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if strings.HasPrefix(t.PkgPath(), prefix) {
		return true
	}
	switch e := err.(type) {
	case interface{ Unwrap() error }:
		return fromPackage(e.Unwrap(), prefix)
	case interface{ Unwrap() []error }:
		for _, err := range e.Unwrap() {
			if fromPackage(err, prefix) {
				return true
			}
		}
	}
	return false
}

// logAttempt logs a failed attempt of task t, run with ctx: a transient
// retry that an outage of the database or Redis caused goes to c's
// outage log (a warning when the outage starts, then debug until a step
// of the same job and kind succeeds); any other failure is logged at warn, each
// time (logFailure).
func (c *Client) logAttempt(ctx context.Context, t *asynq.Task, err error) {
	var retry *errTransientRetry
	if errors.As(err, &retry) && !errors.Is(err, asynq.SkipRetry) {
		if cause := outageOf(retry.err); cause != "" {
			c.outages.Failed(Logger(ctx), cause, outageScope(t), err, slog.String("failed", stepName(t)))
			return
		}
	}
	logFailure(ctx, t, err)
}

// endOutages ends the outages that steps of task t's job and kind failed
// for: one of them succeeded. A step of another kind proves nothing: a
// split that reads no database succeeds through a database outage.
func (c *Client) endOutages(t *asynq.Task) {
	if c.outages.Ongoing() {
		c.outages.EndedAll(outageScope(t))
	}
}

// outageScope is what an outage task t failed for is ended by: a step of
// the same job and kind ("orders map").
func outageScope(t *asynq.Task) string {
	kind := t.Type()
	if kind == typePages {
		kind = typeMap
	}
	return taskJob(t) + " " + kind
}

// taskJob is the name of the job of task t's run, or "" if its payload
// does not say.
func taskJob(t *asynq.Task) string {
	var p struct {
		Run string `json:"run"`
	}
	if json.Unmarshal(t.Payload(), &p) != nil {
		return ""
	}
	job, _ := jobOf(p.Run)
	return job
}
