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

	"github.com/batchmr/batchmr/internal/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func ids(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, _ := pool.Query(context.Background(), "SELECT id FROM items ORDER BY id")
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A long run's split hands on to a new split task every half SplitTimeout,
// and the table changes meanwhile. The new task must go on after the last
// key the first one fed: split again from the start, its pages would be
// cut from the changed table, and the page after the join would overlap
// the last one fed or leave a gap before it.
func TestAKeysetSplitHandedOnOverAChangingTableReadsEveryRowOnce(t *testing.T) {
	t.Parallel()
	seen, start, end := handOnKeyset(t, true, false)
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
	if seen[2100] != 1 {
		t.Errorf("row 2100, inserted past the end while the run split, was read %d times, want once: the split that went on read the table as it was", seen[2100])
	}
}

// A Split that pages another source besides pgsource's table left a
// cursor that is not the table's: the split goes on by position, over a
// table that did not change, and fails nothing.
func TestAKeysetSplitResumedAfterAnotherSourcesCursorGoesOnByPosition(t *testing.T) {
	t.Parallel()
	seen, start, _ := handOnKeyset(t, false, true)
	for _, id := range start {
		if seen[id] != 1 {
			t.Errorf("row %d was read %d times, want once", id, seen[id])
		}
	}
}

// handOnKeyset runs a job that pages the items table with pgsource.Split
// and hands its split on at least once. With change, the table changes
// when the split starts again; with foreign, the first attempt's pages
// carry another source's cursor. It returns how often each row was read,
// and the rows at the start and at the end.
func handOnKeyset(t *testing.T, change, foreign bool) (seen map[int64]int, start, end []int64) {
	t.Helper()
	pool, _ := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	queue := testenv.Queue(t, rdb, prefix)
	table(t, pool, 2000) // 1715 rows: 572 pages of 3
	start = ids(t, pool)
	var (
		splits atomic.Int32
		mu     sync.Mutex
	)
	seen = map[int64]int{}
	job := mapreduce.Job[int, pgsource.KeyRange, int, int]{
		Name: "keyset",
		Split: func(ctx context.Context, _ int, emit func(pgsource.KeyRange) error) error {
			attempt := splits.Add(1)
			if attempt == 1 && foreign {
				return pgsource.Split(ctx, pool, nil, pgsource.Table{Name: "items", Key: "id", PageSize: 3}, func(r pgsource.KeyRange) error {
					mapreduce.SetSplitCursor(ctx, "another source's") // replaces pgsource's own
					return emit(r)
				})
			}
			if attempt == 2 && change {
				// The first rows go; rows appear between the others and after them.
				if _, err := pool.Exec(ctx, `DELETE FROM items WHERE id <= 6;
					INSERT INTO items SELECT g, g * 3 FROM generate_series(7, 2100, 7) g;
					INSERT INTO items SELECT g, g * 3 FROM generate_series(2001, 2100) g WHERE g % 7 <> 0`); err != nil {
					return err
				}
			}
			return pgsource.Split(ctx, pool, nil, pgsource.Table{Name: "items", Key: "id", PageSize: 3}, emit)
		},
		Map: func(ctx context.Context, r pgsource.KeyRange) (int, error) {
			time.Sleep(5 * time.Millisecond) // 572 pages over 4 slots: ~0.7s, past half the split's 1s timeout
			got, err := pgsource.Fetch(ctx, pool, nil, "SELECT id FROM items WHERE id > $1 AND id <= $2", r, pgx.RowTo[int64])
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
	return maps.Clone(seen), start, ids(t, pool)
}
