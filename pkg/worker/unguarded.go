package worker

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batchmr/batchmr/internal/shorten"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
)

// unguardedEvery is how often at most Unguarded warns.
const unguardedEvery = time.Minute

// Unguarded is a pgx query tracer that warns when a query starts on the
// worker's pool without a permit of any of its semaphores in the query's
// context: a job that queries the pool directly, past pgsource and the
// semaphore (or with a context other than its permit's), takes the fleet
// over its permits, and nothing else would show it. It warns at most once
// a minute, counting the queries since, with the step's run, job and page
// (through mapreduce.Logger). It sees pgx's Query, QueryRow and Exec, not
// batches or COPY. Guard adds a semaphore; until one is added it warns of
// nothing.
type Unguarded struct {
	mu     sync.Mutex
	sems   []*semaphore.Semaphore
	last   time.Time
	missed int
}

// Guard makes u accept a permit of sem as guarding a query.
func (u *Unguarded) Guard(sem *semaphore.Semaphore) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sems = append(u.sems, sem)
}

// TraceQueryStart implements pgx.QueryTracer.
func (u *Unguarded) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	u.mu.Lock()
	if len(u.sems) == 0 || slices.ContainsFunc(u.sems, func(s *semaphore.Semaphore) bool { return semaphore.Holding(ctx, s) }) {
		u.mu.Unlock()
		return ctx
	}
	u.missed++
	if time.Since(u.last) < unguardedEvery {
		u.mu.Unlock()
		return ctx
	}
	n := u.missed
	names := make([]string, len(u.sems))
	for i, s := range u.sems {
		names[i] = strconv.Quote(s.Name())
	}
	u.last, u.missed = time.Now(), 0
	u.mu.Unlock()
	mapreduce.Logger(ctx).LogAttrs(ctx, slog.LevelWarn,
		"a query ran on the worker's database pool without a permit of semaphore "+strings.Join(names, " or ")+
			": run it through pgsource.Do, Fetch or Exec with the semaphore worker.Database returns (or with the permit's context), or the fleet runs more queries at once than its permits allow",
		slog.String("sql", shorten.To(data.SQL, 120)), slog.Int("queries_without_a_permit", n))
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (*Unguarded) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
