package app

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
)

// unguardedEvery is how often at most Unguarded warns.
const unguardedEvery = time.Minute

// Unguarded is a pgx query tracer that warns when a query starts on the
// worker's pool without a permit of its semaphore: a job that queries the
// pool directly, past pgsource and the semaphore, takes the fleet over its
// permits, and nothing else would show it. It warns at most once a minute,
// counting the queries since, with the step's run, job and page (through
// mapreduce.Logger). It sees pgx's Query, QueryRow and Exec, not batches
// or COPY. Guard sets the semaphore; until then it warns of nothing.
type Unguarded struct {
	mu     sync.Mutex
	sem    *semaphore.Semaphore
	last   time.Time
	missed int
}

// Guard makes u warn of queries without a permit of sem.
func (u *Unguarded) Guard(sem *semaphore.Semaphore) {
	u.mu.Lock()
	u.sem = sem
	u.mu.Unlock()
}

// TraceQueryStart implements pgx.QueryTracer.
func (u *Unguarded) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	u.mu.Lock()
	sem := u.sem
	if sem == nil || semaphore.Holding(ctx, sem) {
		u.mu.Unlock()
		return ctx
	}
	u.missed++
	if time.Since(u.last) < unguardedEvery {
		u.mu.Unlock()
		return ctx
	}
	n := u.missed
	u.last, u.missed = time.Now(), 0
	u.mu.Unlock()
	sql := data.SQL
	if len(sql) > 120 {
		sql = sql[:120] + "…"
	}
	mapreduce.Logger(ctx).LogAttrs(ctx, slog.LevelWarn,
		"a query ran on the worker's database pool without a permit of semaphore "+quote(sem.Name())+
			": run it through pgsource.Do, Fetch or Exec with the semaphore worker.Database returns, or the fleet runs more queries at once than its permits allow",
		slog.String("sql", sql), slog.Int("queries_without_a_permit", n))
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (*Unguarded) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func quote(s string) string { return `"` + s + `"` }
