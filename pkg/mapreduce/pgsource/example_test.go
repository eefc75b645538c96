package pgsource_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// exampleServers connects to the test servers (make test sets
// BATCHMR_TEST_REDIS_URL and BATCHMR_TEST_DATABASE_URL), creates a table
// "orders" of 10 rows under a schema of its own, and returns a pool whose
// search path finds it, a "db" semaphore of 2 permits, and a cleanup. A
// real program uses its own pool and semaphore (a worker has both:
// worker.Database).
func exampleServers() (*pgxpool.Pool, *semaphore.Semaphore, func()) {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("BATCHMR_TEST_REDIS_URL"))
	if err != nil {
		panic("examples need BATCHMR_TEST_REDIS_URL (make test sets it): " + err.Error())
	}
	rdb := redis.NewClient(opt)
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 2, Prefix: "bmrexample:" + id})
	if err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("BATCHMR_TEST_DATABASE_URL"))
	if err != nil {
		panic("examples need BATCHMR_TEST_DATABASE_URL (make test sets it): " + err.Error())
	}
	schema := "example_" + id
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pgsource.ConfigurePool(cfg)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	for _, sql := range []string{
		"CREATE SCHEMA " + schema,
		"CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL)",
		"INSERT INTO orders SELECT g, g * 10 FROM generate_series(1, 10) g",
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			panic(err)
		}
	}
	return db, sem, func() {
		_, _ = db.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		db.Close() // before the semaphore: Close gives back every permit held
		_ = sem.Close()
		for _, k := range rdb.Keys(ctx, "bmrexample:"+id+"*").Val() {
			rdb.Del(ctx, k)
		}
		_ = rdb.Close()
	}
}

// Split cuts a table into keyset ranges of PageSize rows; Fetch reads one
// page under a permit of the semaphore, held only while the query runs.
// In a job, Split is the job's Split and Fetch runs in its Map.
func Example() {
	db, sem, cleanup := exampleServers()
	defer cleanup()
	ctx := context.Background()

	var pages []pgsource.KeyRange
	err := pgsource.Split(ctx, db, sem, pgsource.Table{Name: "orders", Key: "id", PageSize: 4},
		func(r pgsource.KeyRange) error { pages = append(pages, r); return nil })
	if err != nil {
		panic(err)
	}
	for _, r := range pages {
		amounts, err := pgsource.Fetch(ctx, db, sem, "SELECT amount FROM orders WHERE id > $1 AND id <= $2 ORDER BY id", r, pgx.RowTo[int64])
		if err != nil {
			panic(err)
		}
		fmt.Printf("ids (%d, %d]: %v\n", r.Lo, r.Hi, amounts)
	}
	// Output:
	// ids (0, 4]: [10 20 30 40]
	// ids (4, 8]: [50 60 70 80]
	// ids (8, 10]: [90 100]
}

// Do runs queries of one's own under a permit on one connection, and
// gives the permit back only once the server has finished with them, also
// when ctx ends mid-query.
func ExampleDo() {
	db, sem, cleanup := exampleServers()
	defer cleanup()
	ctx := context.Background()

	err := pgsource.Do(ctx, db, sem, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "UPDATE orders SET amount = 0 WHERE id > $1 AND id <= $2", 0, 5)
		return err
	})
	if err != nil {
		panic(err)
	}
	var zero int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM orders WHERE amount = 0").Scan(&zero); err != nil {
		panic(err)
	}
	fmt.Println("orders zeroed:", zero)
	// Output: orders zeroed: 5
}
