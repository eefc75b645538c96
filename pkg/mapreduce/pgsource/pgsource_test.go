package pgsource_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// table creates items(id, v) with ids 1..n except the multiples of 7, so
// that keys have gaps.
func table(t *testing.T, pool *pgxpool.Pool, n int) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL);
		INSERT INTO items SELECT g, g * 3 FROM generate_series(1, `+itoa(n)+`) g WHERE g % 7 <> 0`)
	if err != nil {
		t.Fatal(err)
	}
	var rows int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	return rows
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestSplitCoversEveryRowOnceInPagesOfPageSize(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	ctx := context.Background()
	rows := table(t, pool, 10_000)
	for _, size := range []int{1, 100, 857, 20_000} {
		var pages []pgsource.KeyRange
		err := pgsource.Split(ctx, pool, nil, pgsource.Table{Name: "items", Key: "id", PageSize: size}, func(r pgsource.KeyRange) error {
			pages = append(pages, r)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var covered int64
		for i, p := range pages {
			if i > 0 && p.Lo != pages[i-1].Hi {
				t.Fatalf("size %d: page %d starts at %d, the previous ended at %d", size, i, p.Lo, pages[i-1].Hi)
			}
			var n int64
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM items WHERE id > $1 AND id <= $2", p.Lo, p.Hi).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > int64(size) || (n < int64(size) && i != len(pages)-1) {
				t.Fatalf("size %d: page %d %+v holds %d rows", size, i, p, n)
			}
			covered += n
		}
		if covered != rows {
			t.Errorf("size %d: pages cover %d rows of %d", size, covered, rows)
		}
		if want := (rows + int64(size) - 1) / int64(size); int64(len(pages)) != want {
			t.Errorf("size %d: %d pages, want %d", size, len(pages), want)
		}
	}
}

func TestSplitOfAnEmptyTableEmitsNothing(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	table(t, pool, 0)
	err := pgsource.Split(context.Background(), pool, nil, pgsource.Table{Name: "items", Key: "id", PageSize: 10}, func(pgsource.KeyRange) error {
		t.Error("a page from an empty table")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSplitOffsetCoversEveryRow(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	ctx := context.Background()
	rows := table(t, pool, 1000)
	var covered int64
	err := pgsource.SplitOffset(ctx, pool, nil, pgsource.Table{Name: "items", PageSize: 100}, func(r pgsource.OffsetRange) error {
		got, err := pgx.CollectRows(must(pool.Query(ctx, "SELECT id FROM items ORDER BY id LIMIT $1 OFFSET $2", r.Args()...)), pgx.RowTo[int64])
		covered += int64(len(got))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if covered != rows {
		t.Errorf("OFFSET pages cover %d rows of %d", covered, rows)
	}
}

func must(rows pgx.Rows, err error) pgx.Rows {
	if err != nil {
		panic(err)
	}
	return rows
}

// Fetch holds its permit while the query runs and gives it back before it
// returns: the caller's processing never holds back the fleet.
func TestFetchHoldsAPermitOnlyWhileTheQueryRuns(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	table(t, pool, 100)
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()

	done := make(chan []int64, 1)
	go func() {
		got, err := pgsource.Fetch(ctx, pool, sem, "SELECT v FROM items, pg_sleep(0.5) WHERE id > $1 AND id <= $2 ORDER BY id",
			pgsource.KeyRange{Lo: 0, Hi: 10}, pgx.RowTo[int64])
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := sem.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no permit held while the query ran")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := <-done
	if want := []int64{3, 6, 9, 12, 15, 18, 24, 27, 30}; len(got) != len(want) {
		t.Errorf("rows %v, want %v", got, want)
	}
	st, err := sem.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Held != 0 {
		t.Errorf("%d permits held after Fetch returned", st.Held)
	}
}

func TestBadTablesGetErrorsThatNameTheFix(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	ctx := context.Background()
	table(t, pool, 10)
	_, _ = pool.Exec(ctx, "CREATE TABLE texts (name text PRIMARY KEY)")
	_, _ = pool.Exec(ctx, "INSERT INTO texts VALUES ('a')")
	none := func(pgsource.KeyRange) error { return nil }
	for _, tc := range []struct {
		t    pgsource.Table
		want string
	}{
		{pgsource.Table{Key: "id", PageSize: 1}, "Name is empty"},
		{pgsource.Table{Name: "items", PageSize: 1}, "Key is empty"},
		{pgsource.Table{Name: "items", Key: "id"}, "PageSize 0"},
		{pgsource.Table{Name: "nope", Key: "id", PageSize: 1}, `"nope" does not exist`},
		{pgsource.Table{Name: "texts", Key: "name", PageSize: 1}, "Key must be an integer column"},
	} {
		err := pgsource.Split(ctx, pool, nil, tc.t, none)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Split(%+v): %v, want an error saying %q", tc.t, err, tc.want)
		}
	}
}

// Keys of type int, with negative values, page as well as bigint ones.
func TestSplitPagesIntKeysDownToTheirMinimum(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE small (id int PRIMARY KEY);
		INSERT INTO small SELECT g FROM generate_series(-2147483648, -2147483648 + 99) g`); err != nil {
		t.Fatal(err)
	}
	var pages []pgsource.KeyRange
	err := pgsource.Split(ctx, pool, nil, pgsource.Table{Name: "small", Key: "id", PageSize: 30}, func(r pgsource.KeyRange) error {
		pages = append(pages, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) != 4 || pages[0].Lo != -2147483649 || pages[3].Hi != -2147483648+99 {
		t.Errorf("pages %+v, want 4 covering [-2^31, -2^31+99]", pages)
	}
}
