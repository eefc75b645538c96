package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
	"github.com/batchmr/batchmr/internal/drain"
	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// IsTransient reports whether err is a fault that passes by itself, so
// that a task retrying it later is likely to succeed:
//   - an error marked with Transient;
//   - a permit of a semaphore lost mid-work (semaphore.ErrLeaseLost: the
//     holder was paused or cut off from Redis past its lease, and its work
//     was cancelled so that the database stays within the permits);
//   - the network: a refused, reset or closed connection, an unexpected
//     EOF, a timeout of the network itself (not of the task's context);
//   - Redis briefly unable to answer (LOADING, a failover, TRYAGAIN);
//   - Postgres, recognised without importing pgx, by the SQLSTATE its
//     errors carry: a connection failure (class 08), the server shutting
//     down or starting (57P01, 57P02, 57P03), too many connections (53300),
//     a serialization failure or deadlock (40001, 40P01); and any error
//     that says it is safe to retry (pgconn.SafeToRetry's SafeToRetry
//     method).
//
// Otherwise a task's context ending (cancel, timeout) is not transient. Map, Split
// and Reduce errors that IsTransient reports are retried with
// JobOptions.TransientBackoff, without spending the job's retries, up to
// JobOptions.TransientRetries times.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var marked *transientMark
	if errors.As(err, &marked) {
		return true
	}
	if errors.Is(err, semaphore.ErrLeaseLost) {
		// The work lost its permit (a pause, a cut from Redis) and was
		// cancelled for the database's sake: nothing wrong with the page.
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var retryable interface{ SafeToRetry() bool }
	if errors.As(err, &retryable) && retryable.SafeToRetry() {
		return true
	}
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		switch code := coded.SQLState(); {
		case len(code) == 5 && code[:2] == "08", // connection exception
			code == "57P01", code == "57P02", code == "57P03", // shutting down, starting up
			code == "53300",                  // too many connections
			code == "40001", code == "40P01": // serialization failure, deadlock
			return true
		}
		return false // a SQL error the server meant: bad query, constraint, …
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	// A reply of Redis's own (LOADING, TRYAGAIN, a failover). Not the
	// message of any error: a job's own error that merely mentions
	// "connection refused" is the job's to classify, with Transient.
	if errors.Is(err, errNotReplicated) {
		return true
	}
	var redisErr redis.Error
	return errors.As(err, &redisErr) && rediserr.Transient(redisErr)
}

// Transient marks err as transient, for IsTransient: return
// mapreduce.Transient(err) from Map, Split or Reduce for a fault of your
// own systems that passes by itself (a rate limit, a service restarting).
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientMark{err}
}

type transientMark struct{ err error }

func (e *transientMark) Error() string { return e.err.Error() }
func (e *transientMark) Unwrap() error { return e.err }

// errTransientRetry is returned to asynq for a task that will retry a
// transient error: IsFailure does not count it, and RetryDelay waits
// TransientBackoff(attempt) before the next attempt.
type errTransientRetry struct {
	err     error
	attempt int // 0 for the first transient retry of the task
	delay   time.Duration
}

func (e *errTransientRetry) Error() string {
	return fmt.Sprintf("%v (transient: retry %d in %v, not counted against the job's retries)", e.err, e.attempt+1, e.delay.Round(time.Millisecond))
}
func (e *errTransientRetry) Unwrap() error { return e.err }

// Defaults of JobOptions.TransientRetries and TransientBackoff.
const (
	defaultTransientRetries = 30
	transientBackoffBase    = time.Second
	transientBackoffCap     = 10 * time.Second
)

// defaultTransientBackoff is 1s doubling to 10s, each a random wait
// between half and all of it: a fleet whose pages all failed at the same
// moment of an outage does not come back at the same instant.
func defaultTransientBackoff(n int) time.Duration {
	d := transientBackoffCap
	if n < 8 {
		d = min(transientBackoffBase<<n, transientBackoffCap)
	}
	return backoff.Jitter(d)
}

// handedBack reports whether err is a step's code handing the step back:
// it wraps ErrHandedBack, and not asynq.SkipRetry, which wins (a step that
// says it can never succeed fails, wherever it runs).
func handedBack(err error) bool {
	return errors.Is(err, ErrHandedBack) && !errors.Is(err, asynq.SkipRetry)
}

// elsewhere is the error that hands a step back for err, which its code
// returned (handedBack): it keeps err's text only, as the task's error
// must wrap nothing but errElsewhere.
func elsewhere(err error) error {
	return fmt.Errorf("%w: %v", errElsewhere, err)
}

// transientRetry decides what a handler does with err, a failure of the
// task's user code: if err is transient and the task has transient retries
// left, or the step was waiting for a permit as this worker stops
// (semaphore.ErrDraining: handed back), it returns the error to give asynq
// (not counted as a failure); nil means err counts as an ordinary failure.
// step names the task within its run ("split", "reduce" or the page index)
// for the count, which lives in Redis so that it survives the task moving
// between workers.
func (c *Client) transientRetry(ctx context.Context, k runKeys, step string, err error, o JobOptions) error {
	if handedBack(err) {
		// The step's code says this worker cannot do it (worker.Database
		// on a worker without a database): another may, so it spends no
		// retry, transient or not, however often it comes back.
		return elsewhere(err)
	}
	if errors.Is(err, semaphore.ErrDraining) || drain.Refused(ctx) {
		// The step waited for its first permit of a semaphore this process
		// drains as it stops: it never began its work, and another worker
		// does it. (drain.Refused: however the step's code wrapped the error.)
		return fmt.Errorf("%w: %w", errStopping, err)
	}
	if o.TransientRetries <= 0 || !IsTransient(err) || ctx.Err() != nil {
		return nil
	}
	n, cerr := c.ledger.countTransient(ctx, k, step, o)
	if cerr != nil {
		// Redis is out too: asynq could not schedule a retry either. The
		// task goes back through asynq's own recovery; do not spend one of
		// its retries on an outage.
		n = 1
	}
	if n > o.TransientRetries {
		return nil
	}
	delay := o.TransientBackoff(n - 1)
	return &errTransientRetry{err: err, attempt: n - 1, delay: delay}
}

// withRedis runs fn, retrying it while it fails for a transient Redis
// reason and ctx lives: a handler that waits out a Redis outage returns
// once Redis is back, when asynq can record what it did. Returning during
// the outage would leave the task "active" in asynq (its state update
// fails, and asynq v0.26 retries that update with an expired context)
// until asynq's recoverer finds it, a minute or more later. fn must be
// idempotent. It reports the outage to outages.
func withRedis(ctx context.Context, outages *outage.Log, what string, fn func(context.Context) error) error {
	bo := backoff.Backoff{Max: 500 * time.Millisecond}
	var warned bool
	var cause outage.Cause
	for {
		err := fn(ctx)
		if err == nil || !(rediserr.Transient(err) || errors.Is(err, errNotReplicated)) || ctx.Err() != nil {
			if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w (%w)", err, ctx.Err())
			}
			if warned && err == nil {
				outages.Ended(cause, "")
			}
			return err
		}
		// A warning once per outage, however many handlers wait here
		// while Redis is away; each try at debug.
		warned, cause = true, redisOutage(err)
		outages.Failed(nil, cause, "", err, slog.String("while", what))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last Redis error: %v)", ctx.Err(), err)
		case <-time.After(bo.Next()):
		}
	}
}
