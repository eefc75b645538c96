package pgsource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Page is a page's bounds, passed to its query as $1 and $2.
type Page interface {
	Args() []any
}

// KeyRange is a keyset page: the rows whose key k satisfies Lo < k <= Hi.
// Its query reads it with "WHERE key > $1 AND key <= $2".
type KeyRange struct {
	Lo int64 `json:"lo"` // exclusive
	Hi int64 `json:"hi"` // inclusive
}

// Args returns Lo and Hi, for $1 and $2.
func (r KeyRange) Args() []any { return []any{r.Lo, r.Hi} }

// OffsetRange is an OFFSET page: its query reads it with
// "ORDER BY … LIMIT $1 OFFSET $2". Only for tables without an ordered key.
type OffsetRange struct {
	Limit  int64 `json:"limit"`
	Offset int64 `json:"offset"`
}

// Args returns Limit and Offset, for $1 and $2.
func (r OffsetRange) Args() []any { return []any{r.Limit, r.Offset} }

// Table names what Split pages.
type Table struct {
	// Name is the table, optionally schema-qualified ("sales.orders").
	Name string
	// Key is a unique, non-null, indexed column of an integer type (bigint,
	// int): pages are ranges of it. With duplicate keys pages may exceed
	// PageSize. Not needed by SplitOffset.
	Key string
	// PageSize is the number of rows per page. Required.
	PageSize int
}

func (t Table) validate(needKey bool) error {
	switch {
	case t.Name == "":
		return errors.New("pgsource: Table.Name is empty: name the table to page")
	case needKey && t.Key == "":
		return errors.New("pgsource: Table.Key is empty: name a unique, indexed integer column (or use SplitOffset)")
	case t.PageSize < 1:
		return fmt.Errorf("pgsource: Table.PageSize %d: use at least 1 row per page", t.PageSize)
	}
	return nil
}

// ident quotes a possibly schema-qualified name.
func ident(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// Split emits the table's keyset pages in key order, each of PageSize rows
// (the last one fewer), in one pass over the key's index: Postgres numbers
// the keys and returns only every PageSize-th, so a table of a million rows
// sends a thousandth of its keys over the wire. The queries run under a
// permit of sem, like every other query of the fleet (nil: no permit; see
// Do for what a permit guarantees); the page bounds are read in full (8
// bytes a page) and the permit released before emit is called, so the
// enqueues never hold it. An empty table emits nothing.
//
// In a run, each page carries its last key as its cursor
// (mapreduce.SetSplitCursor), and a split that starts again part-way (a
// long run's split hands on every half SplitTimeout; a crashed one is
// retried) goes on after the last key fed (mapreduce.ResumeSplit), with
// page bounds read from the table as it is then. So every row present
// throughout the run is in exactly one page, however the table changed;
// rows inserted or deleted meanwhile are read at most once. A Split that
// pages several tables (or shards) in turn, each with Split, goes on in
// the table of the last page fed, after its cursor: the tables before it
// run by position, and their pages, all fed already, are skipped. A Split
// that emits pages of its own as well may go on by position instead, and
// then reads a changing table as positions fall.
func Split(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, t Table, emit func(KeyRange) error) error {
	if err := t.validate(true); err != nil {
		return err
	}
	key, table := ident(t.Key), ident(t.Name)
	prefix := cursorPrefix(db, t)
	after, resumed := resumeAfter(ctx, prefix)
	where, args := "", []any{}
	if resumed {
		where, args = fmt.Sprintf(" WHERE %s > $1", key), []any{after}
	}
	var lo, last *int64
	var bounds []int64
	err := Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		// One snapshot for both queries: a row inserted between them must
		// not fall outside every page.
		return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			err := tx.QueryRow(ctx, fmt.Sprintf("SELECT min(%[1]s)::bigint - 1, max(%[1]s)::bigint FROM %[2]s%[3]s", key, table, where), args...).Scan(&lo, &last)
			if err != nil || lo == nil {
				return err
			}
			// Every PageSize-th key closes a page; the largest key the last.
			rows, err := tx.Query(ctx, fmt.Sprintf(`
				SELECT k::bigint FROM (SELECT %[1]s AS k, row_number() OVER (ORDER BY %[1]s) AS n FROM %[2]s%[3]s) numbered
				WHERE n %% $%[4]d = 0 ORDER BY k`, key, table, where, len(args)+1), append(args, t.PageSize)...)
			if err != nil {
				return err
			}
			bounds, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			return err
		})
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "42846" || pgErr.Code == "22003") {
			return fmt.Errorf("pgsource: splitting %s by %s: %w (Key must be an integer column; use SplitOffset for a table without one)", t.Name, t.Key, err)
		}
		return fmt.Errorf("pgsource: splitting %s by %s: %w", t.Name, t.Key, err)
	}
	if lo == nil {
		expect(ctx, 0)
		return nil // empty, or no row after where the split resumes
	}
	if resumed {
		lo = &after
	}
	pages := len(bounds)
	if pages == 0 || bounds[pages-1] < *last {
		pages++ // the last page, of fewer rows
	}
	expect(ctx, pages)
	from := *lo
	for _, hi := range bounds {
		mapreduce.SetSplitCursor(ctx, prefix+strconv.FormatInt(hi, 10))
		if err := emit(KeyRange{Lo: from, Hi: hi}); err != nil {
			return err
		}
		from = hi
	}
	if from < *last {
		mapreduce.SetSplitCursor(ctx, prefix+strconv.FormatInt(*last, 10))
		return emit(KeyRange{Lo: from, Hi: *last})
	}
	return nil
}

// cursorPrefix is what the split cursor of a page of t in db's database
// starts with; its last key follows. It names the server and database as
// well as the table, so that a Split over two shards' same-named tables
// resumes in the right one.
func cursorPrefix(db *pgxpool.Pool, t Table) string {
	cc := db.Config().ConnConfig
	return fmt.Sprintf("pgsource %q %q %q ", fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database), t.Name, t.Key)
}

// resumeAfter returns the last key of the last page an earlier attempt of
// the run's split fed, and true, when the split starts again part-way
// after a page of this table's (prefix: cursorPrefix): a cursor of
// another source's (a Split that pages several) leaves the split to go on
// by position.
func resumeAfter(ctx context.Context, prefix string) (int64, bool) {
	c, ok := mapreduce.SplitCursor(ctx)
	if !ok {
		return 0, false
	}
	v, mine := strings.CutPrefix(c, prefix)
	after, err := strconv.ParseInt(v, 10, 64)
	if !mine || err != nil {
		return 0, false
	}
	mapreduce.ResumeSplit(ctx)
	return after, true
}

// expect tells the run how many pages the split will emit, so that its
// progress shows while it emits them (mapreduce.ExpectPages); outside a
// run's Split it does nothing.
func expect(ctx context.Context, pages int) {
	if _, ok := mapreduce.RunID(ctx); !ok {
		return
	}
	if err := mapreduce.ExpectPages(ctx, pages); err != nil {
		mapreduce.Logger(ctx).Warn("pgsource: could not record the pages the split expects; progress shows once it ends", "pages", pages, "error", err)
	}
}

// SplitOffset emits OFFSET pages covering the table's current row count.
// Prefer Split: an OFFSET page re-reads every row before it.
func SplitOffset(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, t Table, emit func(OffsetRange) error) error {
	if err := t.validate(false); err != nil {
		return err
	}
	var n int64
	err := Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT count(*) FROM "+ident(t.Name)).Scan(&n)
	})
	if err != nil {
		return fmt.Errorf("pgsource: counting %s: %w", t.Name, err)
	}
	expect(ctx, int((n+int64(t.PageSize)-1)/int64(t.PageSize)))
	for off := int64(0); off < n; off += int64(t.PageSize) {
		if err := emit(OffsetRange{Limit: int64(t.PageSize), Offset: off}); err != nil {
			return err
		}
	}
	return nil
}

// Fetch runs sql for one page — the page's bounds are $1 and $2, then args —
// and returns its rows, built by scan. It holds a permit of sem while the
// query runs and its rows are read, and releases it before returning, so
// the caller processes the rows without holding back the fleet. A permit
// lost mid-query (its lease ran out) cancels the query, and a cancelled
// query's permit goes back only once the query is gone from the server
// (see Do). A nil sem means no permit.
func Fetch[T any](ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, sql string, page Page, scan pgx.RowToFunc[T], args ...any) ([]T, error) {
	var out []T
	err := Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, sql, append(page.Args(), args...)...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scan)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pgsource: fetching page %v: %w", page.Args(), err)
	}
	return out, nil
}

// Exec runs a statement (a page's idempotent write, say) under a permit of
// sem, like Fetch; for several statements on one connection, or in one
// transaction, use Do.
func Exec(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, sql string, args ...any) error {
	err := Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgsource: %w", err)
	}
	return nil
}
