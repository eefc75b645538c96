package main

import (
	"context"
	"errors"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// The job "counts" has pages that take microseconds and no database: the
// kind a run packs several to a task (docs/mapreduce.md, "Packing"). Page
// i's value is Value(i); the run's result is the count and sum of its
// pages' values, which the suite computes on its own.

// CountArgs are a run of counts' arguments.
type CountArgs struct {
	Pages int `json:"pages"` // pages 1..Pages
}

// CountPage is one page of counts.
type CountPage struct {
	I int64 `json:"i"`
}

// Value is page i's value.
func Value(i int64) int64 { return i * 7919 % 100000 }

// Counts is the job "counts".
var Counts = mapreduce.Job[CountArgs, CountPage, Total, Result]{
	Name: "counts",
	Validate: func(a CountArgs) error {
		if a.Pages < 1 {
			return errors.New("pages: use at least 1")
		}
		return nil
	},
	Split: func(ctx context.Context, a CountArgs, emit func(CountPage) error) error {
		for i := int64(1); i <= int64(a.Pages); i++ {
			if err := emit(CountPage{I: i}); err != nil {
				return err
			}
		}
		return nil
	},
	Map: func(_ context.Context, p CountPage) (Total, error) {
		return Total{Rows: 1, Sum: Value(p.I)}, nil
	},
	Reduce: addUp[CountArgs, CountPage],
}
