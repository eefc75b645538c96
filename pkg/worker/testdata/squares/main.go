// Command squares is a worker of a job other than the bundled one, for the
// worker package's tests: two worker binaries with different jobs on one
// Redis. Its job sums squares under a semaphore of its own ("cpu").
package main

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/worker"
)

// Args asks for the sum of i² for i in [0, N), in pages of PageSize.
type Args struct {
	N        int `json:"n"`
	PageSize int `json:"page_size"`
	// SleepMS makes each page take this long, for tests that stop a
	// worker mid-page.
	SleepMS int `json:"sleep_ms"`
}

// Span is a page: [Lo, Hi), and how long to take over it.
type Span struct{ Lo, Hi, SleepMS int }

// Job is the sum of squares.
var Job = mapreduce.Job[Args, Span, int, int]{
	Name: "squares",
	Validate: func(a Args) error {
		if a.PageSize < 1 {
			return errors.New("page_size: use at least 1")
		}
		return nil
	},
	Split: func(ctx context.Context, a Args, emit func(Span) error) error {
		for lo := 0; lo < a.N; lo += a.PageSize {
			if err := emit(Span{lo, min(lo+a.PageSize, a.N), a.SleepMS}); err != nil {
				return err
			}
		}
		return nil
	},
	Map: func(ctx context.Context, s Span) (int, error) {
		sem, err := worker.Semaphore(ctx, "cpu")
		if err != nil {
			return 0, err
		}
		select {
		case <-time.After(time.Duration(s.SleepMS) * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		sum := 0
		err = sem.Do(ctx, func(context.Context) error {
			for i := s.Lo; i < s.Hi; i++ {
				sum += i * i
			}
			return nil
		})
		return sum, err
	},
	Reduce: func(ctx context.Context, a Args, pages iter.Seq2[mapreduce.PageResult[Span, int], error]) (int, error) {
		total := 0
		for p, err := range pages {
			if err != nil {
				return 0, err
			}
			total += p.Result
		}
		worker.Logger(ctx).Info("squares: reduced", "total", total)
		return total, nil
	},
}

// main sets an Observer by MainWith, as a binary that traces does: with
// SQUARES_TRACE set, it writes a line for every step that ends.
func main() {
	worker.MainWith(func(cfg *worker.Config) {
		if os.Getenv("SQUARES_TRACE") != "" {
			cfg.Observer = stepLines{}
		}
	}, Job)
}

// stepLines writes "squares: step KIND ended: OUTCOME" on stderr.
type stepLines struct{}

func (stepLines) Step(ctx context.Context, s mapreduce.Step) (context.Context, func(error)) {
	return ctx, func(err error) { fmt.Fprintf(os.Stderr, "squares: step %s ended: %v\n", s.Kind, err) }
}

func (stepLines) RunEnded(string, string, mapreduce.State, time.Duration) {}
