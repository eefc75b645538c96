package pgsource_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
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
	testenv.WaitFor(t, 5*time.Second, "a permit held while the query runs", func() bool {
		st, err := sem.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Held == 1
	})
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
		{pgsource.Table{Name: "texts", Key: "name", PageSize: 1}, "Key must be an integer column; use SplitSpans"},
	} {
		err := pgsource.Split(ctx, pool, nil, tc.t, none)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Split(%+v): %v, want an error saying %q", tc.t, err, tc.want)
		}
		if strings.Contains(tc.want, "integer") {
			continue // SplitSpans pages a text key
		}
		err = pgsource.SplitSpans(ctx, pool, nil, tc.t, func(pgsource.KeySpan) error { return nil })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SplitSpans(%+v): %v, want an error saying %q", tc.t, err, tc.want)
		}
	}
	// A nullable key with a NULL: that row would be in no page.
	_, _ = pool.Exec(ctx, `CREATE TABLE nullable (id bigint UNIQUE, k text UNIQUE); INSERT INTO nullable VALUES (1, 'a'), (2, 'b'), (NULL, NULL)`)
	if err := pgsource.Split(ctx, pool, nil, pgsource.Table{Name: "nullable", Key: "id", PageSize: 10}, none); err == nil || !strings.Contains(err.Error(), "the key is NULL in some rows") {
		t.Errorf("Split by a key with a NULL: %v; want an error saying so", err)
	}
	if err := pgsource.SplitSpans(ctx, pool, nil, pgsource.Table{Name: "nullable", Key: "k", PageSize: 10}, func(pgsource.KeySpan) error { return nil }); err == nil || !strings.Contains(err.Error(), "the key is NULL in some rows") {
		t.Errorf("SplitSpans by a key with a NULL: %v; want an error saying so", err)
	}
	// A numeric key is not an integer one: Split would round it.
	_, _ = pool.Exec(ctx, `CREATE TABLE decimals (k numeric PRIMARY KEY); INSERT INTO decimals VALUES (1.4), (1.6), (2.4)`)
	if err := pgsource.Split(ctx, pool, nil, pgsource.Table{Name: "decimals", Key: "k", PageSize: 10}, none); err == nil || !strings.Contains(err.Error(), "of type numeric, not an integer") || !strings.Contains(err.Error(), "use SplitSpans") {
		t.Errorf("Split by a numeric key: %v; want an error naming the type and SplitSpans", err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE docs (doc json NOT NULL); INSERT INTO docs VALUES ('{}')`)
	err := pgsource.SplitSpans(ctx, pool, nil, pgsource.Table{Name: "docs", Key: "doc", PageSize: 1}, func(pgsource.KeySpan) error { return nil })
	if want := "Key must be a column Postgres can order"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("SplitSpans by a json column: %v, want an error saying %q", err, want)
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

// spans splits table by key with SplitSpans and returns its pages.
func spans(t *testing.T, pool *pgxpool.Pool, table, key string, size int) []pgsource.KeySpan {
	t.Helper()
	var pages []pgsource.KeySpan
	err := pgsource.SplitSpans(context.Background(), pool, nil, pgsource.Table{Name: table, Key: key, PageSize: size}, func(s pgsource.KeySpan) error {
		pages = append(pages, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

// Keys of any ordered type page by SplitSpans: every row in exactly one
// page, read by the page's query with its bounds as parameters of the
// key's type, and every page but the last full. The keys include each
// type's smallest value, which has nothing before it to page from.
func TestSplitSpansCoversEveryRowOnceInPagesOfPageSize(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	ctx := context.Background()
	for _, tc := range []struct{ typ, keys string }{
		{"uuid", `SELECT md5(g::text)::uuid FROM generate_series(1, 3000) g
			UNION ALL VALUES ('00000000-0000-0000-0000-000000000000'::uuid), ('ffffffff-ffff-ffff-ffff-ffffffffffff')`},
		{"text", `SELECT md5(g::text) || repeat(' x', g % 3) FROM generate_series(1, 3000) g
			UNION ALL VALUES (''), (' '), ('A'), ('a'), ('ä'), ('b'), ('B'), ('O''Brien'), ('%'), ('\')`},
		{"timestamptz", `SELECT '2026-01-01'::timestamptz + g * interval '1.000001 second' FROM generate_series(-1500, 1500) g`},
		// Written as text, 999 sorts after 2500 and -1 after -2500.
		{"bigint", `SELECT g FROM generate_series(-2500, 2500) g`},
		{"numeric", `SELECT g / 7.0 FROM generate_series(-2500, 2500) g`},
	} {
		name := "keys_" + tc.typ
		if _, err := pool.Exec(ctx, `CREATE TABLE `+name+` (k `+tc.typ+` PRIMARY KEY, id bigserial UNIQUE);
			INSERT INTO `+name+` (k) `+tc.keys); err != nil {
			t.Fatal(err)
		}
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{1, 100, 857, 20_000} {
			pages := spans(t, pool, name, "k", size)
			seen := map[int64]int{}
			for i, p := range pages {
				got, err := pgsource.Fetch(ctx, pool, nil, "SELECT id FROM "+name+" WHERE k BETWEEN $1 AND $2", p, pgx.RowTo[int64])
				if err != nil {
					t.Fatal(err)
				}
				if len(got) > size || (len(got) < size && i != len(pages)-1) || len(got) == 0 {
					t.Fatalf("%s, size %d: page %d %+v holds %d rows", tc.typ, size, i, p, len(got))
				}
				for _, id := range got {
					seen[id]++
				}
			}
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("%s, size %d: row %d is in %d pages", tc.typ, size, id, n)
				}
			}
			if len(seen) != rows {
				t.Errorf("%s, size %d: pages cover %d rows of %d", tc.typ, size, len(seen), rows)
			}
			if want := (rows + size - 1) / size; len(pages) != want {
				t.Errorf("%s, size %d: %d pages, want %d", tc.typ, size, len(pages), want)
			}
		}
	}
}

// All rows of a key fall in one page, when a key repeats more often than
// a page holds too: no row is read twice, nor left out.
func TestSplitSpansKeepsADuplicatedKeysRowsInOnePage(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	ctx := context.Background()
	// 5 rows of 'a', 12 of 'b', 1 of 'c', 7 of 'd'.
	if _, err := pool.Exec(ctx, `CREATE TABLE dup (k text NOT NULL, id bigserial PRIMARY KEY);
		INSERT INTO dup (k) SELECT 'a' FROM generate_series(1, 5) UNION ALL SELECT 'b' FROM generate_series(1, 12)
			UNION ALL SELECT 'c' UNION ALL SELECT 'd' FROM generate_series(1, 7)`); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{1, 4, 6, 100} {
		var got []string
		seen := 0
		for _, p := range spans(t, pool, "dup", "k", size) {
			got = append(got, p.First+"-"+p.Last)
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM dup WHERE k BETWEEN $1 AND $2", p.Args()...).Scan(&n); err != nil {
				t.Fatal(err)
			}
			seen += n
		}
		want := map[int]string{1: "a-a b-b c-c d-d", 4: "a-a b-b c-d", 6: "a-b c-c d-d", 100: "a-d"}[size]
		if strings.Join(got, " ") != want || seen != 25 {
			t.Errorf("size %d: pages %v reading %d rows, want %s reading 25", size, got, seen, want)
		}
	}
}

func TestSplitSpansOfAnEmptyTableEmitsNothing(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Postgres(t)
	if _, err := pool.Exec(context.Background(), "CREATE TABLE nothing (k uuid PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if pages := spans(t, pool, "nothing", "k", 10); len(pages) != 0 {
		t.Errorf("pages %v from an empty table", pages)
	}
}
