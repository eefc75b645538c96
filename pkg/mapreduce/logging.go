package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
)

// Attribute keys of batchmr's log records, the same in every package and
// command, so that one query finds every line about a run, a page or a
// semaphore. docs/operations.md lists them.
const (
	attrRun     = "run"     // a run's ID
	attrJob     = "job"     // a job's name
	attrStep    = "step"    // split, map or reduce
	attrPage    = "page"    // a page's index, from 0
	attrPages   = "pages"   // a task of several pages: its first and last
	attrAttempt = "attempt" // a task's attempt, from 1
	attrTask    = "task"    // asynq's task ID
)

// stepLogger returns c's logger with the attributes of task t, run with
// ctx: its run, job, step, page (map only), attempt and task ID, as far as
// t's payload and ctx tell them. They are worked out only once something
// is logged: most tasks log nothing, and slog's With formats its
// attributes at once, which cost a no-op page more than its Map.
func (c *Client) stepLogger(ctx context.Context, t *asynq.Task) *slog.Logger {
	return slog.New(&lazyHandler{base: c.log.Handler(), attrs: func() []slog.Attr {
		step, _ := strings.CutPrefix(t.Type(), typePrefix)
		attrs := make([]slog.Attr, 0, 6)
		var p mapPayload // split and reduce payloads are its first fields
		if json.Unmarshal(t.Payload(), &p) == nil && p.Run != "" {
			job, _ := jobOf(p.Run)
			attrs = append(attrs, slog.String(attrRun, p.Run), slog.String(attrJob, job))
		}
		attrs = append(attrs, slog.String(attrStep, step))
		switch t.Type() {
		case typeMap:
			attrs = append(attrs, slog.Int(attrPage, p.Index))
		case typePages: // each page's Map logs its own page (handleMap)
			parts := p.parts()
			attrs = append(attrs, slog.String(attrPages, pageRange(parts[0].i, parts[len(parts)-1].i)))
		}
		if n, ok := asynq.GetRetryCount(ctx); ok {
			attrs = append(attrs, slog.Int(attrAttempt, n+1))
		}
		if id, ok := asynq.GetTaskID(ctx); ok {
			attrs = append(attrs, slog.String(attrTask, id))
		}
		return attrs
	}})
}

// withPage returns l with the attribute of page i, worked out only once
// something is logged, as stepLogger's are: for each page of a task of
// several.
func withPage(l *slog.Logger, i int) *slog.Logger {
	return slog.New(&lazyHandler{base: l.Handler(), attrs: func() []slog.Attr { return []slog.Attr{slog.Int(attrPage, i)} }})
}

// lazyHandler is base with the attributes attrs returns, asked for the
// first time a record goes through it.
type lazyHandler struct {
	base  slog.Handler
	attrs func() []slog.Attr
	once  sync.Once
	h     slog.Handler
}

func (l *lazyHandler) handler() slog.Handler {
	l.once.Do(func() { l.h = l.base.WithAttrs(l.attrs()) })
	return l.h
}

func (l *lazyHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.base.Enabled(ctx, level)
}

func (l *lazyHandler) Handle(ctx context.Context, r slog.Record) error {
	return l.handler().Handle(ctx, r)
}

func (l *lazyHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return l.handler().WithAttrs(attrs)
}

func (l *lazyHandler) WithGroup(name string) slog.Handler { return l.handler().WithGroup(name) }

// logFailure logs a failed attempt of the task run with ctx (whose Logger
// carries the task's run, job, step, page, attempt and task ID) with its
// error. asynq does not log handler errors, so this is where an operator
// learns why pages fail. A task handed back to a worker that runs its job
// is not a failure, and runner logs it.
func logFailure(ctx context.Context, t *asynq.Task, err error) {
	step := stepName(t)
	msg := "mapreduce: " + step + " failed; retrying"
	if errors.Is(err, asynq.SkipRetry) {
		// Its retries are spent, or no retry can fix its error (invalid
		// arguments, a malformed task): either way it is not retried. The
		// marker that tells asynq so (final) does not show in err's text.
		msg = "mapreduce: " + step + " failed for good: it is not retried"
	}
	Logger(ctx).LogAttrs(ctx, slog.LevelWarn, msg, slog.Any("error", err))
}

// logHandBack logs that t's code handed it back (errElsewhere): at warn at
// most once a minute per Client, else at debug, as a worker without a
// database hands back every page it takes, and a big run has many.
func (c *Client) logHandBack(ctx context.Context, t *asynq.Task, err error) {
	level := slog.LevelDebug
	msg := "mapreduce: " + stepName(t) + " handed back: this worker cannot do it; it is offered again in 2.5–7.5 s"
	if onceAMinute(&c.handBackWarned) {
		level = slog.LevelWarn
		msg += " (more in the next minute at debug)"
	}
	Logger(ctx).LogAttrs(ctx, level, msg, slog.Any("error", err))
}

// onceAMinute reports whether a minute has passed since it last reported
// true for last (unix ns), and marks now if so: one caller of several at
// once gets true. For warnings that would otherwise repeat per page.
func onceAMinute(last *atomic.Int64) bool {
	prev := last.Load()
	return time.Since(time.Unix(0, prev)) >= time.Minute && last.CompareAndSwap(prev, time.Now().UnixNano())
}

// stepName names what task t does in log messages: "page" for a map
// task, "pages" for one of several pages, "split" or "reduce"; a task of
// another type by its type.
func stepName(t *asynq.Task) string {
	switch t.Type() {
	case typeMap:
		return "page"
	case typeSplit, typePages, typeReduce:
		step, _ := strings.CutPrefix(t.Type(), typePrefix)
		return step
	}
	return fmt.Sprintf("task of unknown type %q", t.Type())
}

// logOutcome logs that this process ended run in state, with msg (the
// run's error) if any: one line per run, from whichever process records
// its outcome.
func (c *Client) logOutcome(ctx context.Context, runID string, state State, msg string) {
	job, _ := jobOf(runID)
	level, attrs := slog.LevelInfo, []slog.Attr{slog.String(attrRun, runID), slog.String(attrJob, job), slog.String("state", string(state))}
	if state == StateFailed {
		level = slog.LevelWarn
	}
	if msg != "" {
		attrs = append(attrs, slog.String("error", msg))
	}
	c.log.LogAttrs(ctx, level, "mapreduce: run ended", attrs...)
}
