// Package ordersreport is the example job of examples/pagination: a report
// over a large orders table, computed page by page across a fleet of
// workers, with every page query throttled by the fleet-wide semaphore.
//
// Split cuts the table into keyset pages (pgsource.Split). Map aggregates
// one page — orders, amount, orders per status — in one query under a
// permit, and writes the page's row idempotently: a retried page overwrites
// its row, never adds a second. Reduce sums the pages and writes the report.
// The result equals the same aggregate computed in one SQL statement
// (Expected), which is how the demo and the tests check it.
package ordersreport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Name is the job's name.
const Name = "orders-report"

// Args are a run's arguments; the zero value is usable.
type Args struct {
	// PageSize is the number of orders per page. Default 5000.
	PageSize int `json:"page_size,omitempty"`
	// SlowMS makes every page query sleep this long in Postgres
	// (pg_sleep), so that the semaphore's throttling is visible.
	SlowMS int `json:"slow_ms,omitempty"`
}

// Totals are the aggregates of a page, and of the whole report.
type Totals struct {
	Orders      int64            `json:"orders"`
	AmountCents int64            `json:"amount_cents"`
	ByStatus    map[string]int64 `json:"by_status"`
}

func (t *Totals) add(o Totals) {
	t.Orders += o.Orders
	t.AmountCents += o.AmountCents
	if t.ByStatus == nil {
		t.ByStatus = map[string]int64{}
	}
	for s, n := range o.ByStatus {
		t.ByStatus[s] += n
	}
}

// Equal reports whether two totals are the same aggregate.
func (t Totals) Equal(o Totals) bool {
	return t.Orders == o.Orders && t.AmountCents == o.AmountCents && maps.Equal(t.ByStatus, o.ByStatus)
}

// Page is one keyset page of orders, with the run's slow-query knob.
type Page struct {
	pgsource.KeyRange
	SlowMS int `json:"slow_ms,omitempty"`
}

// Report is the run's result.
type Report struct {
	Totals
	Pages int `json:"pages"`
}

// Schema creates the job's tables: orders (when missing) and the per-page
// and per-run report tables. Seed and each run's Split create them.
const Schema = `
CREATE TABLE IF NOT EXISTS orders (
	id           bigserial PRIMARY KEY,
	customer_id  int         NOT NULL,
	amount_cents bigint      NOT NULL,
	status       text        NOT NULL,
	created_at   timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS orders_report_pages (
	run_id       text   NOT NULL,
	lo           bigint NOT NULL,
	hi           bigint NOT NULL,
	orders       bigint NOT NULL,
	amount_cents bigint NOT NULL,
	by_status    jsonb  NOT NULL,
	PRIMARY KEY (run_id, lo)
);
CREATE TABLE IF NOT EXISTS orders_reports (
	run_id       text PRIMARY KEY,
	orders       bigint NOT NULL,
	amount_cents bigint NOT NULL,
	by_status    jsonb  NOT NULL,
	pages        int    NOT NULL,
	written_at   timestamptz NOT NULL DEFAULT now()
);`

// Seed replaces the orders table with rows orders, generated in Postgres
// (generate_series) with deterministic values.
func Seed(ctx context.Context, db *pgxpool.Pool, rows int) error {
	if rows < 0 {
		return fmt.Errorf("seed: --rows %d: use 0 or more", rows)
	}
	_, err := db.Exec(ctx, `DROP TABLE IF EXISTS orders`)
	if err == nil {
		err = createTables(ctx, db, nil)
	}
	if err == nil {
		_, err = db.Exec(ctx, `
			INSERT INTO orders (customer_id, amount_cents, status, created_at)
			SELECT ((g * 7) % 10000)::int, (g * 7919) % 100000,
			       (ARRAY['new','paid','shipped','cancelled','refunded'])[1 + ((g * 13) % 5)::int],
			       timestamptz '2026-01-01' + g * interval '1 second'
			FROM generate_series(1::bigint, $1::bigint) g`, rows)
	}
	if err == nil {
		_, err = db.Exec(ctx, `ANALYZE orders`)
	}
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// createTables runs Schema under an advisory lock: CREATE TABLE IF NOT
// EXISTS is not safe against itself, and workers starting together on an
// empty database all run it. In a job it holds a permit of sem, as every
// query of the fleet does (nil: none, for Seed).
func createTables(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore) error {
	return pgsource.Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('batchmr/ordersreport/schema'))`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, Schema)
			return err
		})
	})
}

// Expected computes the report in one SQL statement, to check a run by.
func Expected(ctx context.Context, db *pgxpool.Pool) (Totals, error) {
	t := Totals{ByStatus: map[string]int64{}}
	rows, err := db.Query(ctx, `SELECT status, count(*), sum(amount_cents)::bigint FROM orders GROUP BY status`)
	if err != nil {
		return t, fmt.Errorf("expected report: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[statusRow])
	if err != nil {
		return t, fmt.Errorf("expected report: %w", err)
	}
	for _, r := range all {
		t.add(r.totals())
	}
	return t, nil
}

type statusRow struct {
	Status      string
	Orders      int64
	AmountCents int64
}

func (r statusRow) totals() Totals {
	return Totals{Orders: r.Orders, AmountCents: r.AmountCents, ByStatus: map[string]int64{r.Status: r.Orders}}
}

// pageSQL aggregates one keyset page and writes the page's row, in one
// statement under one permit. The row is keyed by (run, page): a retried
// page overwrites it, never adds a second. pg_sleep($3) runs once per page,
// whatever the plan and even for an empty page: a scalar subquery in a
// condition becomes an InitPlan that runs once.
const pageSQL = `
WITH agg AS (
	SELECT status, count(*) AS orders, coalesce(sum(amount_cents), 0)::bigint AS amount_cents
	FROM orders
	WHERE id > $1 AND id <= $2 AND (SELECT pg_sleep($3)) IS NOT NULL
	GROUP BY status
), page AS (
	INSERT INTO orders_report_pages (run_id, lo, hi, orders, amount_cents, by_status)
	SELECT $4, $1, $2, coalesce(sum(orders), 0), coalesce(sum(amount_cents), 0),
	       coalesce(jsonb_object_agg(status, orders), '{}'::jsonb)
	FROM agg
	ON CONFLICT (run_id, lo) DO UPDATE
	SET hi = excluded.hi, orders = excluded.orders, amount_cents = excluded.amount_cents, by_status = excluded.by_status
)
SELECT status, orders, amount_cents FROM agg`

// Job is the orders report. Its functions take the database pool and the
// "db" semaphore from the worker that runs them (worker.Database), so any
// process can start it and decode its result without a database:
//
//	id, err := ordersreport.Job.Start(ctx, mr, ordersreport.Args{PageSize: 5000}, mapreduce.StartOptions{})
var Job = mapreduce.Job[Args, Page, Totals, Report]{
	Name:     Name,
	Validate: validate,
	Split: func(ctx context.Context, a Args, emit func(Page) error) error {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return err
		}
		if err := createTables(ctx, db, sem); err != nil {
			return fmt.Errorf("%s: creating its tables: %w", Name, err)
		}
		size := a.PageSize
		if size == 0 {
			size = 5000
		}
		return pgsource.Split(ctx, db, sem, pgsource.Table{Name: "orders", Key: "id", PageSize: size}, func(r pgsource.KeyRange) error {
			return emit(Page{KeyRange: r, SlowMS: a.SlowMS})
		})
	},
	Map: func(ctx context.Context, r Page) (Totals, error) {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return Totals{}, err
		}
		run, _ := mapreduce.RunID(ctx)
		rows, err := pgsource.Fetch(ctx, db, sem, pageSQL, r, pgx.RowToStructByPos[statusRow], float64(r.SlowMS)/1000, run)
		if err != nil {
			return Totals{}, err
		}
		t := Totals{ByStatus: map[string]int64{}}
		for _, row := range rows {
			t.add(row.totals())
		}
		return t, nil
	},
	Reduce: func(ctx context.Context, a Args, pages iter.Seq2[mapreduce.PageResult[Page, Totals], error]) (Report, error) {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return Report{}, err
		}
		var rep Report
		rep.ByStatus = map[string]int64{}
		for p, err := range pages {
			if err != nil {
				return Report{}, err
			}
			if p.Err != nil { // only under CompleteSemantics; this job uses SuccessSemantics
				return Report{}, fmt.Errorf("page %d failed: %w", p.Index, p.Err)
			}
			rep.add(p.Result)
			rep.Pages++
		}
		run, _ := mapreduce.RunID(ctx)
		byStatus, _ := json.Marshal(rep.ByStatus)
		err = pgsource.Exec(ctx, db, sem, `
			INSERT INTO orders_reports (run_id, orders, amount_cents, by_status, pages)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (run_id) DO UPDATE
			SET orders = excluded.orders, amount_cents = excluded.amount_cents, by_status = excluded.by_status,
			    pages = excluded.pages, written_at = now()`,
			run, rep.Orders, rep.AmountCents, byStatus, rep.Pages)
		return rep, err
	},
	Options: mapreduce.JobOptions{
		// A page query that fails (a deadlock, a failover) is worth
		// retrying soon: 1s, 2s, 4s … up to a minute, not asynq's
		// default of 15 s and more.
		Backoff: func(n int, _ error) time.Duration { return min(time.Second<<min(n, 6), time.Minute) },
	},
}

// validate refuses arguments that could only fail the run later.
func validate(a Args) error {
	var errs []error
	if a.PageSize < 0 {
		errs = append(errs, fmt.Errorf("page_size %d: use a positive number of orders per page, or leave it out for 5000", a.PageSize))
	}
	if a.SlowMS < 0 {
		errs = append(errs, fmt.Errorf("slow_ms %d: use 0 or more milliseconds", a.SlowMS))
	}
	return errors.Join(errs...)
}
