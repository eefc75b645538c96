package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/hibiken/asynq"
)

// asynqLogger sends asynq's logs to the worker's slog logger, each record
// with component=asynq. Its warnings and errors of a Redis outage go to
// outages (asynqOutage): asynq repeats them every few seconds while Redis
// is away.
type asynqLogger struct {
	log     *slog.Logger
	outages *outage.Log
}

func (l asynqLogger) Debug(args ...any) { l.emit(slog.LevelDebug, args) }
func (l asynqLogger) Info(args ...any)  { l.emit(slog.LevelInfo, args) }
func (l asynqLogger) Warn(args ...any)  { l.emit(slog.LevelWarn, args) }
func (l asynqLogger) Error(args ...any) { l.emit(slog.LevelError, args) }

// Fatal logs at error level, with fatal=true, and exits 1: asynq's Logger
// interface promises that Fatal ends the process, and asynq does not go on
// after calling it. asynq v0.26 calls it nowhere; the record comes first so
// that, should a later version call it, the process does not end without
// saying why.
func (l asynqLogger) Fatal(args ...any) {
	l.log.Error(fmt.Sprint(args...), "component", "asynq", "fatal", true)
	os.Exit(1)
}

func (l asynqLogger) emit(level slog.Level, args []any) {
	ctx := context.Background()
	if level >= slog.LevelWarn && l.outages != nil {
		msg := fmt.Sprint(args...)
		if cause := asynqOutage(msg); cause != "" {
			l.outages.Failed(nil, cause, "asynq", errors.New(msg))
			return
		}
	}
	if l.log.Enabled(ctx, level) {
		l.log.Log(ctx, level, fmt.Sprint(args...), "component", "asynq")
	}
}

// asynqLevel is the asynq.LogLevel matching log's: the lowest of debug,
// info, warn and error that log's handler enables (error when it enables
// none), so that asynq formats only the records log keeps.
func asynqLevel(log *slog.Logger) asynq.LogLevel {
	ctx := context.Background()
	switch {
	case log.Enabled(ctx, slog.LevelDebug):
		return asynq.DebugLevel
	case log.Enabled(ctx, slog.LevelInfo):
		return asynq.InfoLevel
	case log.Enabled(ctx, slog.LevelWarn):
		return asynq.WarnLevel
	}
	return asynq.ErrorLevel
}
