package mrotel_test

import (
	"context"
	"errors"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/mrotel"
	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A real run traced end to end: one span for the split, one per attempt
// of each page (a failed first attempt marked as an error), one for the
// reduce and one for the run, each with the run's attributes; and Map runs
// inside its page's span, so that what it traces is a child of it.
func TestARunIsTracedWithASpanPerSplitPageAttemptReduceAndRun(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	queue := testenv.JobQueue(t, rdb, prefix, "traced")
	const pages = 4
	var (
		mu       sync.Mutex
		calls    = map[int]int{}
		mapSpans = map[trace.SpanID]int{} // the span each Map call ran in -> page
	)
	job := mapreduce.Job[int, int, int, int]{
		Name: "traced",
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(ctx context.Context, page int) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			mapSpans[trace.SpanContextFromContext(ctx).SpanID()] = page
			calls[page]++
			if page == 0 && calls[page] == 1 {
				return 0, errors.New("page 0 fails once")
			}
			return page * page, nil
		},
		Reduce: func(ctx context.Context, n int, results iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			sum := 0
			for r, err := range results {
				if err != nil {
					return 0, err
				}
				sum += r.Result
			}
			return sum, nil
		},
		Options: mapreduce.JobOptions{Queue: queue, Backoff: func(int, error) time.Duration { return 10 * time.Millisecond }},
	}
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, job); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix, Observer: mrotel.New(mrotel.Options{TracerProvider: tp})})
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: 2, Queues: map[string]int{queue: 1}, TaskCheckInterval: 10 * time.Millisecond,
		DelayedTaskCheckInterval: 50 * time.Millisecond, RetryDelayFunc: c.RetryDelay, IsFailure: c.IsFailure,
		LogLevel: asynq.FatalLevel,
	})
	mux := asynq.NewServeMux()
	c.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := job.Start(ctx, c, pages, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Wait(ctx, run)
	if err != nil || st.State != mapreduce.StateSucceeded {
		t.Fatalf("run: %v, %+v", err, st)
	}
	// The handlers end their spans as they return, after the run's end.
	var spans []sdktrace.ReadOnlySpan
	testenv.WaitFor(t, 5*time.Second, "every span to end", func() bool {
		spans = rec.Ended()
		return len(spans) >= 1+pages+1+1+1
	})
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
		if s.Name() != "batchmr.run" && (attr(s, mrotel.AttrTask).AsString() == "" || attr(s, mrotel.AttrAttempt).AsInt64() < 1) {
			t.Errorf("span %s lacks its task ID or attempt: %v", s.Name(), s.Attributes())
		}
		if attr(s, mrotel.AttrRun).AsString() != run || attr(s, mrotel.AttrJob).AsString() != "traced" {
			t.Errorf("span %s lacks the run's attributes: %v", s.Name(), s.Attributes())
		}
	}
	if n := len(byName["batchmr.split"]); n != 1 {
		t.Errorf("%d split spans, want 1", n)
	}
	if n := len(byName["batchmr.reduce"]); n != 1 {
		t.Errorf("%d reduce spans, want 1", n)
	}
	if r := byName["batchmr.run"]; len(r) != 1 || attr(r[0], mrotel.AttrState).AsString() != "succeeded" || !r[0].EndTime().After(r[0].StartTime()) {
		t.Errorf("run spans %v, want one, succeeded, with its duration", r)
	}
	maps := byName["batchmr.map"]
	if len(maps) != pages+1 {
		t.Fatalf("%d map spans, want %d: one per attempt", len(maps), pages+1)
	}
	failed := 0
	mu.Lock()
	defer mu.Unlock()
	for _, s := range maps {
		page := int(attr(s, mrotel.AttrPage).AsInt64())
		if got, ok := mapSpans[s.SpanContext().SpanID()]; !ok || got != page {
			t.Errorf("the map span of page %d is not the span Map ran in (Map saw %v)", page, mapSpans)
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("map span kind %v, want consumer", s.SpanKind())
		}
		if s.Status().Code == codes.Error {
			failed++
			if page != 0 || attr(s, mrotel.AttrAttempt).AsInt64() != 1 || attr(s, mrotel.AttrOutcome).AsString() != "failed" {
				t.Errorf("error span for page %d attempt %d, want only page 0's first attempt", page, attr(s, mrotel.AttrAttempt).AsInt64())
			}
		} else if attr(s, mrotel.AttrOutcome).AsString() != "succeeded" {
			t.Errorf("map span of page %d: outcome %q, want succeeded", page, attr(s, mrotel.AttrOutcome).AsString())
		}
	}
	if failed != 1 {
		t.Errorf("%d map spans with status Error, want 1 (page 0's first attempt)", failed)
	}
}
