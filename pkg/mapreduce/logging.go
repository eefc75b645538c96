package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"

	"github.com/hibiken/asynq"
)

// logFailure logs a failed attempt of task t, with its run, job, page
// (or step), attempt number (1 for the first), task ID and error. asynq
// does not log handler errors, so this is where an operator learns why
// pages fail. A task handed back to a worker that runs its job is not a
// failure, and runner logs it.
func (c *Client) logFailure(ctx context.Context, t *asynq.Task, err error) {
	step, _ := strings.CutPrefix(t.Type(), "batchmr:")
	attrs := make([]slog.Attr, 0, 7)
	var p mapPayload // split and reduce payloads are its first fields
	if json.Unmarshal(t.Payload(), &p) == nil && p.Run != "" {
		job, _ := jobOf(p.Run)
		attrs = append(attrs, slog.String("run", p.Run), slog.String("job", job))
	}
	if t.Type() == typeMap {
		step = "page"
		attrs = append(attrs, slog.Int("page", p.Index))
	} else {
		attrs = append(attrs, slog.String("step", step))
	}
	if n, ok := asynq.GetRetryCount(ctx); ok {
		attrs = append(attrs, slog.Int("attempt", n+1))
	}
	if id, ok := asynq.GetTaskID(ctx); ok {
		attrs = append(attrs, slog.String("task", id))
	}
	attrs = append(attrs, slog.Any("error", err))
	msg := "mapreduce: " + step + " failed; retrying"
	if errors.Is(err, asynq.SkipRetry) {
		msg = "mapreduce: " + step + " failed for good: its retries are spent"
	}
	c.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}

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
