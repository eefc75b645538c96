package pgsource

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// probeName is the application_name of a Probe's connection: its query
// runs outside the semaphore and is not one of the worker's.
const probeName = "batchmr-probe"

// probeQuery costs Postgres the same small bit of CPU each time (about a
// millisecond on an idle core), so that its time tells how much CPU the
// server has to spare.
const probeQuery = "SELECT count(*) FROM generate_series(1, 20000)"

// A Probe times a fixed-cost query on a Postgres, for a semaphore's
// controller (semaphore.ControllerOptions.Probe = probe.Run).
type Probe struct {
	db   *pgxpool.Pool
	mu   sync.Mutex
	conn *pgx.Conn
}

// NewProbe returns a Probe of db's server. It connects on its first Run,
// on a connection of its own (application_name batchmr-probe), outside
// the pool and without a permit.
func NewProbe(db *pgxpool.Pool) *Probe { return &Probe{db: db} }

// Run runs the probe query once and returns how long the server took,
// reconnecting after an error.
func (p *Probe) Run(ctx context.Context) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		cfg := p.db.Config().ConnConfig.Copy()
		cfg.RuntimeParams["application_name"] = probeName
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return 0, fmt.Errorf("pgsource: probe: connecting: %w", err)
		}
		p.conn = c
	}
	start := time.Now()
	var n int64
	if err := p.conn.QueryRow(ctx, probeQuery).Scan(&n); err != nil {
		_ = p.conn.Close(context.Background())
		p.conn = nil
		return 0, fmt.Errorf("pgsource: probe: %w", err)
	}
	return time.Since(start), nil
}

// Close closes the probe's connection, if open.
func (p *Probe) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		_ = p.conn.Close(context.Background())
		p.conn = nil
	}
}
