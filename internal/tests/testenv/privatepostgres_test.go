//go:build unix

package testenv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/jackc/pgx/v5"
)

// A private Postgres runs with the settings given and keeps its data
// across a fast stop, a crash (immediate stop) and a restart, at the same
// URL; while it is stopped, connections are refused.
func TestPrivatePostgresKeepsItsDataAcrossStopsAndRestarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PrivatePostgres(t, "work_mem=7MB")
	exec := func(sql string) error {
		c, err := pgx.Connect(ctx, pg.URL)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	var fsync, workMem string
	c, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('work_mem')").Scan(&fsync, &workMem); err != nil ||
		fsync != "off" || workMem != "7MB" {
		t.Errorf("fsync %q, work_mem %q (%v), want off and the setting passed, 7MB", fsync, workMem, err)
	}
	pg.Stop(testenv.StopFast)
	// The session of before the stop is over.
	if err := c.Ping(ctx); err == nil {
		t.Error("a connection of before a fast stop still answers")
	}
	_ = c.Close(ctx)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := pgx.Connect(cctx, pg.URL); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("connecting to a stopped server: %v, want it refused at once", err)
	}
	pg.Start()
	if err := exec("INSERT INTO kept VALUES (2)"); err != nil {
		t.Fatalf("after a fast stop and a start: %v", err)
	}
	pg.Stop(testenv.StopImmediate)
	pg.Start() // recovers from the WAL
	pg.Restart(testenv.StopFast)
	var n int
	c, err = pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if err := c.QueryRow(ctx, "SELECT sum(n) FROM kept").Scan(&n); err != nil || n != 3 {
		t.Errorf("after a crash and a restart the table sums to %d (%v), want 3", n, err)
	}
}
