package mapreduce

import (
	"context"
	"log/slog"

	"github.com/hibiken/asynq"
)

// logFailure logs a failed attempt of a task of run: a page (page ≥ 0),
// the split (page == pageSplit) or the reduce (pageReduce), with its
// attempt number (1 for the first) and error. asynq does not log handler
// errors, so this is where an operator learns why pages fail.
func (c *Client) logFailure(ctx context.Context, msg, run string, page int, err error) {
	job, _ := jobOf(run)
	attrs := []slog.Attr{slog.String("run", run), slog.String("job", job)}
	switch page {
	case pageSplit:
		attrs = append(attrs, slog.String("step", "split"))
	case pageReduce:
		attrs = append(attrs, slog.String("step", "reduce"))
	default:
		attrs = append(attrs, slog.Int("page", page))
	}
	if n, ok := asynq.GetRetryCount(ctx); ok {
		attrs = append(attrs, slog.Int("attempt", n+1))
	}
	if id, ok := asynq.GetTaskID(ctx); ok {
		attrs = append(attrs, slog.String("task", id))
	}
	attrs = append(attrs, slog.Any("error", err))
	c.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}

// The page argument of logFailure for a run's split and reduce.
const (
	pageSplit  = -1
	pageReduce = -2
)

// logOutcome logs that this process ended run in state, with msg (the
// run's error) if any: one line per run, from whichever process records
// its outcome.
func (c *Client) logOutcome(ctx context.Context, run string, state State, msg string) {
	job, _ := jobOf(run)
	level, attrs := slog.LevelInfo, []slog.Attr{slog.String("run", run), slog.String("job", job), slog.String("state", string(state))}
	if state == StateFailed {
		level = slog.LevelWarn
	}
	if msg != "" {
		attrs = append(attrs, slog.String("error", msg))
	}
	c.log.LogAttrs(ctx, level, "mapreduce: run ended", attrs...)
}
