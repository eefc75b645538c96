// Command pagebench compares keyset pages with OFFSET pages on the example
// orders table: the time to read one page at the start, the middle and the
// end of the table, side by side.
//
//	go run ./internal/cmd/pagebench -database-url postgres://…   (make bench runs it)
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
	"github.com/batchmr/batchmr/internal/benchutil"
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
