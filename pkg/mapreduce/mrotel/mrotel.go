// Package mrotel traces batchmr runs with OpenTelemetry: an Observer for
// mapreduce.Config.Observer that makes a span for each split, page and
// reduce a process works on, and one for each run it ends, all carrying
// the run's attributes. Package mapreduce itself imports no OpenTelemetry.
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
//	mr, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Observer: mrotel.New(mrotel.Options{TracerProvider: tp})})
//
// A step's span is the parent of whatever the job's Split, Map or Reduce
// traces with the context it receives (queries, HTTP calls). Tasks carry
// no trace context through Redis: each step's span is a root span, or a
// child of a span already in the handler's context; find a run's spans by
// their batchmr.run attribute.
package mrotel

import (
	"context"
	"errors"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer mrotel uses.
const ScopeName = "github.com/batchmr/batchmr/pkg/mapreduce/mrotel"

// Attribute keys of the spans.
const (
	AttrJob     = attribute.Key("batchmr.job")
	AttrRun     = attribute.Key("batchmr.run")
	AttrStep    = attribute.Key("batchmr.step") // split, map or reduce
	AttrPage    = attribute.Key("batchmr.page") // map spans only
	AttrAttempt = attribute.Key("batchmr.attempt")
	AttrTask    = attribute.Key("batchmr.task_id")
	AttrOutcome = attribute.Key("batchmr.outcome") // succeeded, failed, ended or handed_back
	AttrState   = attribute.Key("batchmr.state")   // run spans: the state the run ended in
)

// Options configure an Observer. The zero value is usable.
type Options struct {
	// TracerProvider makes the tracer. Default otel.GetTracerProvider(),
	// the global one.
	TracerProvider trace.TracerProvider
}

// Observer makes spans for the steps and the runs of a mapreduce.Client.
// It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer
}

var _ mapreduce.Observer = (*Observer)(nil)

// New returns an Observer that traces with opts.TracerProvider.
func New(opts Options) *Observer {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Observer{tracer: tp.Tracer(ScopeName)}
}

// Step implements mapreduce.Observer: it starts a span named
// "batchmr.split", "batchmr.map" or "batchmr.reduce", of kind consumer
// (the step processes a task from a queue), with the step's job, run,
// page, attempt and task ID, and ends it with the step's outcome: status
// Error with the error's message for a failed attempt, Unset otherwise.
func (o *Observer) Step(ctx context.Context, s mapreduce.Step) (context.Context, func(error)) {
	attrs := []attribute.KeyValue{
		AttrJob.String(s.Job), AttrRun.String(s.Run), AttrStep.String(string(s.Kind)),
		AttrAttempt.Int(s.Attempt), AttrTask.String(s.TaskID),
	}
	if s.Kind == mapreduce.StepMap {
		attrs = append(attrs, AttrPage.Int(s.Page))
	}
	ctx, span := o.tracer.Start(ctx, "batchmr."+string(s.Kind), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		switch {
		case err == nil:
			span.SetAttributes(AttrOutcome.String("succeeded"))
		case errors.Is(err, mapreduce.ErrRunCancelled), errors.Is(err, mapreduce.ErrRunEnded):
			span.SetAttributes(AttrOutcome.String("ended"))
			span.AddEvent("the run ended while the step worked", trace.WithAttributes(attribute.String("reason", err.Error())))
		case errors.Is(err, mapreduce.ErrHandedBack):
			span.SetAttributes(AttrOutcome.String("handed_back"))
			span.AddEvent("handed back without its work done, for another attempt", trace.WithAttributes(attribute.String("reason", err.Error())))
		default:
			span.SetAttributes(AttrOutcome.String("failed"))
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// RunEnded implements mapreduce.Observer: it records a span named
// "batchmr.run" covering the run, from its creation (or last retry) to its
// end, with its job, ID and final state; status Error for a failed run.
func (o *Observer) RunEnded(job, runID string, state mapreduce.State, took time.Duration) {
	end := time.Now()
	_, span := o.tracer.Start(context.Background(), "batchmr.run",
		trace.WithTimestamp(end.Add(-took)),
		trace.WithAttributes(AttrJob.String(job), AttrRun.String(runID), AttrState.String(string(state))))
	if state == mapreduce.StateFailed {
		span.SetStatus(codes.Error, "the run failed")
	}
	span.End(trace.WithTimestamp(end))
}
