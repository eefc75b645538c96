// Command sumworker is the fault suite's worker binary: worker.Main with
// two jobs, "sums" and "counts" (counts.go), built from public packages
// only, as a user's worker is.
//
// The job totals the table amounts(id bigint primary key, amount bigint)
// page by page: Split cuts it into keyset pages (pgsource.Split), Map
// counts and sums one page in one query under a permit of the "db"
// semaphore (pgsource.Fetch) that also sleeps sleep_ms in Postgres
// (pg_sleep), so that a page holds its permit for a known time, and Reduce
// adds the pages up. The result equals
//
//	SELECT count(*), sum(amount) FROM amounts
//
// which is how the suite checks a run. The job keeps mapreduce's default
// options: what the suite proves holds for a job that sets none.
package main

import (
	"context"
	"errors"
	"iter"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/jackc/pgx/v5"
)

// Args are a run's arguments.
type Args struct {
	PageSize int `json:"page_size"` // rows per page
	SleepMS  int `json:"sleep_ms"`  // how long each of a page's queries sleeps in Postgres
	// Queries is how many queries a page runs, one after another, each
	// on a slice of its rows and under a permit of its own; 0 is 1. Many
	// short permits taken back to back keep every worker's semaphore
	// handle releasing while its other handlers wait: its new waiters
	// are carried by its releases (the semaphore's carried enqueues).
	Queries int `json:"queries,omitempty"`
}

// Page is one keyset page of amounts.
type Page struct {
	pgsource.KeyRange
	SleepMS int `json:"sleep_ms"`
	Queries int `json:"queries,omitempty"`
}

// Total is the count and sum of amounts of a page, or of the table.
type Total struct {
	Rows int64 `json:"rows"`
	Sum  int64 `json:"sum"`
}

// Result is a run's result.
type Result struct {
	Total
	Pages int `json:"pages"`
}

// pageSQL totals one page. pg_sleep runs once per page, whatever the plan:
// a scalar subquery in a condition becomes an InitPlan that runs once.
const pageSQL = `
SELECT count(*)::bigint, coalesce(sum(amount), 0)::bigint
FROM amounts
WHERE id > $1 AND id <= $2 AND (SELECT pg_sleep($3)) IS NOT NULL`

// Job is the sum of amounts.
var Job = mapreduce.Job[Args, Page, Total, Result]{
	Name: "sums",
	Validate: func(a Args) error {
		if a.PageSize < 1 || a.SleepMS < 0 || a.Queries < 0 {
			return errors.New("page_size: use at least 1 row; sleep_ms and queries: use 0 or more")
		}
		return nil
	},
	Split: func(ctx context.Context, a Args, emit func(Page) error) error {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return err
		}
		return pgsource.Split(ctx, db, sem, pgsource.Table{Name: "amounts", Key: "id", PageSize: a.PageSize}, func(r pgsource.KeyRange) error {
			return emit(Page{KeyRange: r, SleepMS: a.SleepMS, Queries: a.Queries})
		})
	},
	Map: func(ctx context.Context, p Page) (Total, error) {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return Total{}, err
		}
		n := int64(max(p.Queries, 1))
		var t Total
		for q := range n { // slice q of n of the page's keys
			part := pgsource.KeyRange{Lo: p.Lo + (p.Hi-p.Lo)*q/n, Hi: p.Lo + (p.Hi-p.Lo)*(q+1)/n}
			rows, err := pgsource.Fetch(ctx, db, sem, pageSQL, part, pgx.RowToStructByPos[Total], float64(p.SleepMS)/1000)
			if err != nil {
				return Total{}, err
			}
			t.Rows += rows[0].Rows
			t.Sum += rows[0].Sum
		}
		return t, nil
	},
	Reduce: addUp[Args, Page],
}

// addUp is the Reduce of both jobs: the count and sum of their pages'
// totals, and how many pages there were.
func addUp[A, P any](_ context.Context, _ A, pages iter.Seq2[mapreduce.PageResult[P, Total], error]) (Result, error) {
	var r Result
	for p, err := range pages {
		if err != nil {
			return Result{}, err
		}
		r.Rows += p.Result.Rows
		r.Sum += p.Result.Sum
		r.Pages++
	}
	return r, nil
}

func main() { worker.Main(Job, Counts) }
