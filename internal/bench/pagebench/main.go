// Command pagebench compares keyset pages with OFFSET pages on the example
// orders table: the time to read one page at the start, the middle and the
// end of the table, side by side; and the time to split the table by its
// bigint key with pgsource.Split against pgsource.SplitSpans by the same
// key and by a random uuid.
//
//	go run ./internal/bench/pagebench -database-url postgres://…   (make bench runs it)
//
// It creates and fills its own schema (pagebench_<random>) and drops it
// afterwards.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	dbURL    = flag.String("database-url", os.Getenv("BATCHMR_TEST_DATABASE_URL"), "Postgres URL (default $BATCHMR_TEST_DATABASE_URL)")
	rows     = flag.Int("rows", 1_000_000, "orders in the table")
	pageSize = flag.Int("page-size", 5000, "rows per page")
	samples  = flag.Int("samples", 15, "reads of each page; the median is reported")
)

func main() {
	flag.Parse()
	if *dbURL == "" {
		fmt.Fprintln(os.Stderr, "pagebench: no database: pass -database-url or set BATCHMR_TEST_DATABASE_URL (make bench does both)")
		os.Exit(2)
	}
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "pagebench_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, *dbURL)
	must(err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	must(err)
	defer func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close(context.Background())
	}()
	cfg, err := pgxpool.ParseConfig(*dbURL)
	must(err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	must(err)
	defer pool.Close()
	start := time.Now()
	must(ordersreport.Seed(ctx, pool, *rows))
	seeded := time.Since(start)

	var version string
	must(pool.QueryRow(ctx, "SHOW server_version").Scan(&version))
	fmt.Printf("# pagebench: %s, Postgres %s, %d orders (seeded in %v), pages of %d\n\n",
		time.Now().Format("2006-01-02"), version, *rows, seeded.Round(time.Millisecond), *pageSize)
	fmt.Println("## Reading one page: keyset vs OFFSET (median of", *samples, "reads)")
	fmt.Println()
	fmt.Println("| page at | keyset `WHERE id > $1 AND id <= $2` | OFFSET `ORDER BY id LIMIT $1 OFFSET $2` | OFFSET / keyset |")
	fmt.Println("|---|---|---|---|")
	const aggregate = "SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM "
	for _, at := range []struct {
		name string
		off  int
	}{{"start", 0}, {"middle", *rows / 2}, {"end", *rows - *pageSize}} {
		var lo int64
		must(pool.QueryRow(ctx, "SELECT id - 1 FROM orders ORDER BY id OFFSET $1 LIMIT 1", at.off).Scan(&lo))
		var hi int64
		must(pool.QueryRow(ctx, "SELECT id FROM orders ORDER BY id OFFSET $1 LIMIT 1", at.off+*pageSize-1).Scan(&hi))
		keyset := timeQuery(ctx, pool, aggregate+"orders WHERE id > $1 AND id <= $2", lo, hi)
		offset := timeQuery(ctx, pool, aggregate+"(SELECT amount_cents FROM orders ORDER BY id LIMIT $1 OFFSET $2) p", *pageSize, at.off)
		fmt.Printf("| %s (row %d) | %.2f ms | %.2f ms | %.1f× |\n", at.name, at.off, ms(keyset), ms(offset), float64(offset)/float64(keyset))
	}
	fmt.Println()
	splits(ctx, pool)
}

// splits times whole splits of the table, interleaved: Split by the bigint
// id, SplitSpans by the same id, and SplitSpans by a random uuid column
// (added here, with its unique index); then reads one middle page of each
// kind.
func splits(ctx context.Context, pool *pgxpool.Pool) {
	for _, sql := range []string{
		"ALTER TABLE orders ADD COLUMN ref uuid NOT NULL DEFAULT gen_random_uuid()",
		"CREATE UNIQUE INDEX ON orders (ref)",
		"VACUUM ANALYZE orders", // index-only scans, as on a table autovacuum keeps
	} {
		_, err := pool.Exec(ctx, sql)
		must(err)
	}
	table := func(key string) pgsource.Table { return pgsource.Table{Name: "orders", Key: key, PageSize: *pageSize} }
	var mid struct {
		id       pgsource.KeyRange
		idSpan   pgsource.KeySpan
		uuidSpan pgsource.KeySpan
	}
	kinds := []struct {
		name string
		run  func(pages *int) error
	}{
		{"`Split`, bigint id", func(n *int) error { return pgsource.Split(ctx, pool, nil, table("id"), keepMiddle(n, &mid.id)) }},
		{"`SplitSpans`, bigint id", func(n *int) error {
			return pgsource.SplitSpans(ctx, pool, nil, table("id"), keepMiddle(n, &mid.idSpan))
		}},
		{"`SplitSpans`, random uuid ref", func(n *int) error {
			return pgsource.SplitSpans(ctx, pool, nil, table("ref"), keepMiddle(n, &mid.uuidSpan))
		}},
	}
	const rounds = 5
	times := make([][]time.Duration, len(kinds))
	pages := make([]int, len(kinds))
	for range rounds {
		for i, k := range kinds {
			t := time.Now()
			must(k.run(&pages[i]))
			times[i] = append(times[i], time.Since(t))
		}
	}
	fmt.Printf("## Splitting the table (median of %d interleaved splits)\n\n", rounds)
	fmt.Println("| split | pages | time | vs `Split` |")
	fmt.Println("|---|---|---|---|")
	base := benchutil.Median(times[0])
	for i, k := range kinds {
		m := benchutil.Median(times[i])
		fmt.Printf("| %s | %d | %.1f ms | %.2f× |\n", k.name, pages[i], ms(m), float64(m)/float64(base))
	}
	fmt.Println()
	const aggregate = "SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM orders WHERE "
	fmt.Printf("## Reading the middle page of each split (median of %d reads)\n\n", *samples)
	fmt.Println("| page | time |")
	fmt.Println("|---|---|")
	fmt.Printf("| `WHERE id > $1 AND id <= $2` | %.2f ms |\n", ms(timeQuery(ctx, pool, aggregate+"id > $1 AND id <= $2", mid.id.Args()...)))
	fmt.Printf("| `WHERE id BETWEEN $1 AND $2` | %.2f ms |\n", ms(timeQuery(ctx, pool, aggregate+"id BETWEEN $1 AND $2", mid.idSpan.Args()...)))
	fmt.Printf("| `WHERE ref BETWEEN $1 AND $2`, uuid | %.2f ms |\n", ms(timeQuery(ctx, pool, aggregate+"ref BETWEEN $1 AND $2", mid.uuidSpan.Args()...)))
	fmt.Println()
}

// keepMiddle returns an emit function that counts the pages in *pages,
// from 0, and keeps the middle one of the table in *mid.
func keepMiddle[P any](pages *int, mid *P) func(P) error {
	*pages = 0
	return func(p P) error {
		if *pages++; *pages == *rows / *pageSize / 2 {
			*mid = p
		}
		return nil
	}
}

// timeQuery runs sql samples times, checks both forms read a full page,
// and returns the median duration.
func timeQuery(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) time.Duration {
	var ds []time.Duration
	for range *samples {
		var n, sum int64
		t := time.Now()
		must(pool.QueryRow(ctx, sql, args...).Scan(&n, &sum))
		ds = append(ds, time.Since(t))
		if n != int64(*pageSize) {
			must(fmt.Errorf("a page read %d rows, want %d: %s", n, *pageSize, sql))
		}
	}
	return benchutil.Median(ds)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "pagebench:", err)
		os.Exit(1)
	}
}
