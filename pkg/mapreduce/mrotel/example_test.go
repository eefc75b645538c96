package mrotel_test

import (
	"context"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/mrotel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Trace every split, page and reduce this process works on, and every
// run it ends: give the Observer to the Client that workers register.
func ExampleNew() {
	exporter := tracetest.NewInMemoryExporter() // a real program exports to its collector
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
	defer tp.Shutdown(context.Background())

	cfg := mapreduce.Config{
		Jobs:     mapreduce.NewJobs(),
		Observer: mrotel.New(mrotel.Options{TracerProvider: tp}),
	}
	_ = cfg // mapreduce.New(rdb, cfg), then worker.Run or Client.Register
}
