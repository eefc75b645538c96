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
	// Key is a unique, non-null, indexed column: pages are ranges of it.
	// Split needs an integer type (bigint, int); SplitSpans takes any type
	// Postgres orders (uuid, text, a timestamp). With duplicate keys pages
	// may exceed PageSize. Not needed by SplitOffset.
	Key string
	// PageSize is the number of rows per page. Required.
	PageSize int
}

func (t Table) validate(needKey bool) error {
	switch {
	case t.Name == "":
		return errors.New("pgsource: Table.Name is empty: name the table to page")
	case needKey && t.Key == "":
		return errors.New("pgsource: Table.Key is empty: name a unique, indexed column (an integer for Split; any ordered type for SplitSpans), or use SplitOffset")
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
// enqueues never hold it. An empty table emits nothing. The key must be an
// integer column; SplitSpans pages a table by any other ordered key (a
// uuid, text).
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
	var after int64
	_, resumed := resumeAfter(ctx, prefix, func(c string) bool {
		var err error
		after, err = strconv.ParseInt(c, 10, 64)
		return err == nil
	})
	where, args := "", []any{}
	if resumed {
		where, args = fmt.Sprintf(" WHERE %s > $1", key), []any{after}
	}
	var lo, last *int64
	var bounds []int64
	var typ string
	err := snapshot(ctx, db, sem, t, "Key must be an integer column; use SplitSpans for a key of another type (a uuid, text), SplitOffset for a table without one",
		func(ctx context.Context, tx pgx.Tx) error {
			err := tx.QueryRow(ctx, fmt.Sprintf("SELECT min(%[1]s)::bigint - 1, max(%[1]s)::bigint, pg_typeof(min(%[1]s))::text FROM %[2]s%[3]s", key, table, where), args...).Scan(&lo, &last, &typ)
			if err != nil {
				return err
			}
			// A numeric or float key would be rounded to bigint, and rows
			// between two rounded bounds lost.
			if typ != "smallint" && typ != "integer" && typ != "bigint" {
				return fmt.Errorf("the key is of type %s, not an integer, and would be rounded: use SplitSpans, which pages any type Postgres orders", typ)
			}
			if lo == nil {
				return nil
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
	if err != nil {
		return err
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
		if err := emitPage(ctx, emit, prefix+strconv.FormatInt(hi, 10), KeyRange{Lo: from, Hi: hi}); err != nil {
			return err
		}
		from = hi
	}
	if from < *last {
		return emitPage(ctx, emit, prefix+strconv.FormatInt(*last, 10), KeyRange{Lo: from, Hi: *last})
	}
	return nil
}

// KeySpan is a keyset page of a table paged by a key of any ordered type
// (SplitSpans): the rows whose key k satisfies First <= k <= Last, both
// keys of the table written as Postgres writes them as text. Its query
// reads it with "WHERE key BETWEEN $1 AND $2", or "key >= $1 AND key <=
// $2": Postgres reads $1 and $2 as the key's type.
type KeySpan struct {
	First string `json:"first"` // inclusive
	Last  string `json:"last"`  // inclusive
}

// Args returns First and Last, for $1 and $2.
func (s KeySpan) Args() []any { return []any{s.First, s.Last} }

// SplitSpans is Split for a table whose key is not an integer: a uuid,
// text (in the column's collation), a timestamp, a date, numeric — any
// type Postgres orders and writes as text and reads back as the same
// value. It emits the table's pages in key order, each of PageSize rows
// (the last one fewer), with the same single pass over the key's index,
// the same permit, and the same resumption in a run as Split (see
// there): each page carries its last key as its cursor. Pages are spans
// of keys present when they were cut, first and last included, where
// Split's pages join end to end: a row inserted between two pages while
// the run splits is read by neither (rows inserted or deleted meanwhile
// are read at most once), and every row present throughout is read
// exactly once. An empty table emits nothing.
//
// With duplicate keys, all rows of one key fall in one page, which may
// then exceed PageSize. A key with a NULL is refused: that row would be in
// no page.
//
// Keys travel as text, from the split's connection to the pages'
// queries, so every connection of the fleet must write and read the key's
// type alike: Postgres's defaults do (a DateStyle or extra_float_digits
// changed on some connections would not). Each page's next key is an index
// probe, so the key's index must be in the column's own collation (as a
// primary key's is), or a split reads the whole table once per page.
func SplitSpans(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, t Table, emit func(KeySpan) error) error {
	if err := t.validate(true); err != nil {
		return err
	}
	key, table := ident(t.Key), ident(t.Name)
	prefix := cursorPrefix(db, t)
	after, resumed := resumeAfter(ctx, prefix, func(string) bool { return true })
	where, args := "", []any{}
	if resumed {
		where, args = fmt.Sprintf(" WHERE %s > $1", key), []any{after}
	}
	var first, last *string
	type end struct{ last, next *string }
	var ends []end
	err := snapshot(ctx, db, sem, t, "Key must be a column Postgres can order (a uuid, text, a timestamp, an integer)",
		func(ctx context.Context, tx pgx.Tx) error {
			// ORDER BY … LIMIT 1, not min and max: Postgres has no min(uuid).
			// ORDER BY names the table's column (t.key): the key alone
			// would name the text it is written as, sorted as text, by a
			// scan of the whole table.
			err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT t.%[1]s::text FROM %[2]s t%[3]s ORDER BY t.%[1]s LIMIT 1),
				(SELECT t.%[1]s::text FROM %[2]s t%[3]s ORDER BY t.%[1]s DESC LIMIT 1)`, key, table, where), args...).Scan(&first, &last)
			if err != nil || first == nil {
				return err
			}
			// Every PageSize-th key closes a page (once, however often it
			// occurs), and the smallest key after it opens the next: a
			// probe of the index per page. The aliases keep the key's
			// name, whatever it is, from capturing the outer one.
			rows, err := tx.Query(ctx, fmt.Sprintf(`
				SELECT ends.pgsource_k::text, (SELECT t.%[1]s FROM %[2]s t WHERE t.%[1]s > ends.pgsource_k ORDER BY t.%[1]s LIMIT 1)::text FROM (
					SELECT DISTINCT pgsource_k FROM (SELECT %[1]s AS pgsource_k, row_number() OVER (ORDER BY %[1]s) AS pgsource_n FROM %[2]s%[3]s) numbered
					WHERE pgsource_n %% $%[4]d = 0) ends
				ORDER BY ends.pgsource_k`, key, table, where, len(args)+1), append(args, t.PageSize)...)
			if err != nil {
				return err
			}
			ends, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (e end, err error) {
				return e, row.Scan(&e.last, &e.next)
			})
			return err
		})
	if err != nil {
		return err
	}
	if first == nil {
		expect(ctx, 0)
		return nil // empty, or no row after where the split resumes
	}
	pages := len(ends)
	if pages == 0 || ends[pages-1].next != nil {
		pages++ // the last page, of fewer rows
	}
	expect(ctx, pages)
	for _, e := range ends {
		if err := emitPage(ctx, emit, prefix+*e.last, KeySpan{First: *first, Last: *e.last}); err != nil {
			return err
		}
		first = e.next
		if first == nil {
			return nil // the last page was full
		}
	}
	return emitPage(ctx, emit, prefix+*last, KeySpan{First: *first, Last: *last})
}

// snapshot runs a split's queries in fn in one read-only snapshot, under a
// permit of sem, so that a row inserted between them cannot fall outside
// every page. Its error names the table and key, with fix when Postgres
// says the key's type cannot be paged so.
func snapshot(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, t Table, fix string, fn func(context.Context, pgx.Tx) error) error {
	err := Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			// A row whose key is NULL is in no range of keys: refuse
			// rather than leave it out. (An index probe: btree indexes
			// hold NULLs.)
			var nulls bool
			if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s IS NULL)", ident(t.Name), ident(t.Key))).Scan(&nulls); err != nil {
				return err
			}
			if nulls {
				return errors.New("the key is NULL in some rows, which no page would hold: page by a NOT NULL column, or give those rows keys")
			}
			return fn(ctx, tx)
		})
	})
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	// 22P02, 42846, 22003: not an integer; 42883: no ordering for the type.
	if errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "42846" || pgErr.Code == "22003" || pgErr.Code == "42883") {
		return fmt.Errorf("pgsource: splitting %s by %s: %w (%s)", t.Name, t.Key, err, fix)
	}
	return fmt.Errorf("pgsource: splitting %s by %s: %w", t.Name, t.Key, err)
}

// emitPage emits page, with cursor as its split cursor in a run.
func emitPage[P any](ctx context.Context, emit func(P) error, cursor string, page P) error {
	mapreduce.SetSplitCursor(ctx, cursor)
	return emit(page)
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
// after a page of this table's (prefix: cursorPrefix) whose key is valid:
// a cursor of another source's (a Split that pages several) leaves the
// split to go on by position.
func resumeAfter(ctx context.Context, prefix string, valid func(key string) bool) (string, bool) {
	c, ok := mapreduce.SplitCursor(ctx)
	if !ok {
		return "", false
	}
	after, mine := strings.CutPrefix(c, prefix)
	if !mine || !valid(after) {
		return "", false
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
