package mapreduce

import (
	"context"
	"errors"
	"log/slog"
)

type ctxKey int

const (
	runIDKey ctxKey = iota
	pageIndexKey
	loggerKey
	expectKey
)

// ExpectPages tells the run whose Split is running with ctx how many pages
// Split is going to emit, when it knows before it has emitted them all (a
// split that reads every page boundary first, as pgsource's does). With a
// window, a large run's split lasts most of the run, and its total is only
// written when the split ends; until then, Status.Expected lets the
// console and the command line show the run's progress and an ETA. It is
// a hint: the total that ends the run is what Split emitted. Outside a
// Split, or when the run cannot be reached, it does nothing and returns
// the error.
func ExpectPages(ctx context.Context, n int) error {
	f, ok := ctx.Value(expectKey).(func(context.Context, int) error)
	if !ok {
		return errors.New("mapreduce: ExpectPages called outside a Split")
	}
	return f(ctx, n)
}

// RunID returns the ID of the run whose Split, Map or Reduce is running
// with ctx. Use it, with PageIndex, to make the effects of a Map idempotent:
// "run ID, page index" names one page's work across every retry.
func RunID(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(runIDKey).(string)
	return id, ok
}

// PageIndex returns the index of the page a Map is processing, from 0 in
// split order.
func PageIndex(ctx context.Context) (int, bool) {
	i, ok := ctx.Value(pageIndexKey).(int)
	return i, ok
}

// Logger returns the logger for code running with ctx; it is never nil.
// In a job's Split, Map or Reduce (and in what they call with their
// context, such as pgsource) it is the Client's logger (Config.Logger; in
// a worker, the worker's) with the step's attributes: run, job, step
// ("split", "map" or "reduce"), page (a Map's page index), attempt (1 for
// the first) and task (asynq's task ID), so that every line a step logs
// says which run, page and attempt it is about. Elsewhere it is the logger
// of ContextWithLogger, or slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey).(*slog.Logger); ok && l != nil {
		return l
	}
	return slog.Default()
}

// ContextWithLogger returns a copy of ctx whose Logger is l; a nil l
// leaves ctx as it is. A worker gives its tasks a context so; tests of a
// job's functions can do the same to capture what they log.
func ContextWithLogger(ctx context.Context, l *slog.Logger) context.Context {
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, loggerKey, l)
}
