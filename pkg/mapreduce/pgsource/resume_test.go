package pgsource_test

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ids returns the keys of the named tables, which the tests give disjoint
// ranges.
func ids(t *testing.T, pool *pgxpool.Pool, tables ...string) []int64 {
	t.Helper()
	var out []int64
	for _, tb := range tables {
		rows, _ := pool.Query(context.Background(), "SELECT id FROM "+tb+" ORDER BY id")
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got...)
	}
	return out
}

// tablePage is a keyset page of one of several tables: a range of its id,
// or a span of its text key k (Span).
type tablePage struct {
	Table string
	pgsource.KeyRange
	Span *pgsource.KeySpan `json:",omitempty"`
}

// handOn runs a job whose Split is split (given its attempt, from 1) on a
// worker with a 1s SplitTimeout, and fails t unless the run succeeds after
// Split ran more than once. Map reads its page's keys (5 ms a page, so
// that a run of ~600 pages over 4 slots outlasts half the timeout); it
// returns how often each key was read.
func handOn(t *testing.T, pool *pgxpool.Pool, split func(ctx context.Context, attempt int32, emit func(tablePage) error) error) map[int64]int {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	queue := testenv.Queue(t, rdb, prefix)
	var (
		splits atomic.Int32
		mu     sync.Mutex
		seen   = map[int64]int{}
	)
	job := mapreduce.Job[int, tablePage, int, int]{
		Name: "keyset",
		Split: func(ctx context.Context, _ int, emit func(tablePage) error) error {
			return split(ctx, splits.Add(1), emit)
		},
		Map: func(ctx context.Context, p tablePage) (int, error) {
			time.Sleep(5 * time.Millisecond)
			sql, page := "SELECT id FROM "+p.Table+" WHERE id > $1 AND id <= $2", pgsource.Page(p.KeyRange)
			if p.Span != nil {
				sql, page = "SELECT id FROM "+p.Table+" WHERE k BETWEEN $1 AND $2", *p.Span
			}
			got, err := pgsource.Fetch(ctx, pool, nil, sql, page, pgx.RowTo[int64])
			if err != nil {
				return 0, err
			}
			mu.Lock()
			for _, id := range got {
				seen[id]++
			}
			mu.Unlock()
			return len(got), nil
		},
		Options: mapreduce.JobOptions{Queue: queue, Window: 50, SplitTimeout: time.Second,
			Backoff: func(int, error) time.Duration { return 10 * time.Millisecond }},
	}
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, job); err != nil {
		t.Fatal(err)
	}
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 4, Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, RetryDelayFunc: c.RetryDelay, IsFailure: c.IsFailure, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	c.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	ctx := context.Background()
	id, err := job.Start(ctx, c, 0, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := c.Wait(wctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("run ended %s: %s", st.State, st.Error)
	}
	if n := splits.Load(); n < 2 {
		t.Fatalf("Split ran %d times: the split never handed on, so this test proves nothing", n)
	}
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(seen)
}

// wantEachOnce fails t if a key was read twice, or a key of start still
// present at the end was not read.
func wantEachOnce(t *testing.T, seen map[int64]int, start, end []int64) {
	t.Helper()
	var twice, missed []int64
	for id, n := range seen {
		if n > 1 {
			twice = append(twice, id)
		}
	}
	for _, id := range start {
		if slices.Contains(end, id) && seen[id] == 0 {
			missed = append(missed, id)
		}
	}
	if len(twice)+len(missed) > 0 {
		slices.Sort(twice)
		t.Errorf("rows read twice: %v; rows present throughout the run not read: %v", twice, missed)
	}
}

// splitTable emits the pages of a table, in pages of 3 rows.
func splitTable(ctx context.Context, pool *pgxpool.Pool, table string, emit func(tablePage) error) error {
	return pgsource.Split(ctx, pool, nil, pgsource.Table{Name: table, Key: "id", PageSize: 3}, func(r pgsource.KeyRange) error {
		return emit(tablePage{Table: table, KeyRange: r})
	})
}

// change deletes the first rows of items and inserts rows between the
// others and past them.
const change = `DELETE FROM items WHERE id <= 6;
	INSERT INTO items SELECT g, g * 3 FROM generate_series(7, 2100, 7) g;
	INSERT INTO items SELECT g, g * 3 FROM generate_series(2001, 2100) g WHERE g % 7 <> 0`

// A long run's split hands on to a new split task every half SplitTimeout,
// and the table changes meanwhile. The new task must go on after the last
// key the first one fed: split again from the start, its pages would be
// cut from the changed table, and the page after the join would overlap
// the last one fed or leave a gap before it.
func TestAKeysetSplitHandedOnOverAChangingTableReadsEveryRowOnce(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	table(t, pool, 2000) // 1715 rows: 572 pages of 3
	start := ids(t, pool, "items")
	seen := handOn(t, pool, func(ctx context.Context, attempt int32, emit func(tablePage) error) error {
		if attempt == 2 {
			if _, err := pool.Exec(ctx, change); err != nil {
				return err
			}
		}
		return splitTable(ctx, pool, "items", emit)
	})
	wantEachOnce(t, seen, start, ids(t, pool, "items"))
	if seen[2100] != 1 {
		t.Errorf("row 2100, inserted past the end while the run split, was read %d times, want once: the split that went on read the table as it was", seen[2100])
	}
}

// SplitSpans goes on after its cursor as Split does, over a table paged by
// a text key that changes meanwhile: rows deleted, and rows inserted
// before the cursor, among the pages still to come, and past the end.
func TestASpanSplitHandedOnOverAChangingTableReadsEveryRowOnce(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	table(t, pool, 2000)
	if _, err := pool.Exec(context.Background(), `ALTER TABLE items ADD COLUMN k text;
		UPDATE items SET k = md5(id::text); ALTER TABLE items ALTER k SET NOT NULL;
		CREATE UNIQUE INDEX ON items (k)`); err != nil {
		t.Fatal(err)
	}
	start := ids(t, pool, "items")
	seen := handOn(t, pool, func(ctx context.Context, attempt int32, emit func(tablePage) error) error {
		if attempt == 2 {
			if _, err := pool.Exec(ctx, `DELETE FROM items WHERE id <= 6;
				INSERT INTO items SELECT g, g * 3, md5(g::text) FROM generate_series(7, 2100, 7) g;
				INSERT INTO items VALUES (5000, 0, 'zzzz')`); err != nil {
				return err
			}
		}
		return pgsource.SplitSpans(ctx, pool, nil, pgsource.Table{Name: "items", Key: "k", PageSize: 3}, func(s pgsource.KeySpan) error {
			return emit(tablePage{Table: "items", Span: &s})
		})
	})
	wantEachOnce(t, seen, start, ids(t, pool, "items"))
	if seen[5000] != 1 {
		t.Errorf("row 5000, inserted past the end while the run split, was read %d times, want once: the split that went on read the table as it was", seen[5000])
	}
}

// A Split that pages two tables in turn is handed on while it pages the
// second, and both change meanwhile: the first is paged again by position
// and its pages, all fed, are skipped; the second goes on after its cursor.
func TestASplitOverTwoTablesResumesInTheSecond(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	table(t, pool, 2000)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE firsts (id bigint PRIMARY KEY);
		INSERT INTO firsts SELECT -g FROM generate_series(1, 30) g`); err != nil {
		t.Fatal(err)
	}
	start := ids(t, pool, "firsts", "items")
	seen := handOn(t, pool, func(ctx context.Context, attempt int32, emit func(tablePage) error) error {
		if attempt == 2 {
			if _, err := pool.Exec(ctx, change+`; DELETE FROM firsts WHERE id > -10`); err != nil {
				return err
			}
		}
		if err := splitTable(ctx, pool, "firsts", emit); err != nil {
			return err
		}
		return splitTable(ctx, pool, "items", emit)
	})
	wantEachOnce(t, seen, start, ids(t, pool, "firsts", "items"))
}

// A Split that emits pages of another source besides pgsource's table
// left a cursor that is not the table's: the split goes on by position,
// over a table that did not change, and fails nothing.
func TestAKeysetSplitResumedAfterAnotherSourcesCursorGoesOnByPosition(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	table(t, pool, 2000)
	start := ids(t, pool, "items")
	seen := handOn(t, pool, func(ctx context.Context, attempt int32, emit func(tablePage) error) error {
		if attempt == 1 {
			return splitTable(ctx, pool, "items", func(p tablePage) error {
				mapreduce.SetSplitCursor(ctx, "another source's") // replaces pgsource's own
				return emit(p)
			})
		}
		return splitTable(ctx, pool, "items", emit)
	})
	for _, id := range start {
		if seen[id] != 1 {
			t.Errorf("row %d was read %d times, want once", id, seen[id])
		}
	}
}
