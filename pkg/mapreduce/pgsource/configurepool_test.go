package pgsource_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A pool that ConfigurePool configured (a worker's is) cancels a query on
// the server when its context ends, and keeps the connection: when the query call returns, the backend is idle,
// so its permit can go back at once.
func TestAConfiguredPoolCancelsAQueryOnTheServerAndKeepsItsConnection(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pgsource.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := conn.Exec(ctx, "SELECT pg_sleep(60)"); err == nil {
		t.Fatal("a query past its context's deadline succeeded")
	}
	if conn.Conn().IsClosed() {
		t.Fatal("the connection was closed: the query was abandoned, not cancelled on the server")
	}
	var state string
	if err := pool.QueryRow(context.Background(), "SELECT state FROM pg_stat_activity WHERE pid = $1",
		int32(conn.Conn().PgConn().PID())).Scan(&state); err != nil || state != "idle" {
		t.Errorf("the cancelled query's backend: state %q (%v), want idle", state, err)
	}
	var one int
	if err := conn.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Errorf("the connection after the cancel: %d, %v; want it usable", one, err)
	}
}
