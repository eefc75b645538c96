package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// DBSemaphore is the name of the semaphore whose permits guard the
// worker's database, "db": Database returns it with the pool.
const DBSemaphore = app.SemaphoreName

// Env is what a worker hands the jobs it runs: its connections, its
// fleet-wide semaphores and its logger. A job's Split, Map and Reduce reach
// it through their context (Database, Semaphore, Logger), so that a job is
// a plain value that any process can hold, start and inspect without
// connecting to anything; only the worker that runs it connects.
type Env struct {
	// DB is the worker's Postgres pool; nil when the worker has no
	// database URL.
	DB *pgxpool.Pool
	// Redis is the worker's Redis client.
	Redis redis.UniversalClient
	// Semaphores are the fleet-wide semaphores the worker opened, by name
	// (Config.Permits).
	Semaphores map[string]*semaphore.Semaphore
	// Logger is the worker's logger; nil means slog.Default().
	Logger *slog.Logger
}

type envKey struct{}

// NewContext returns a copy of ctx that carries env, and env.Logger as
// mapreduce.Logger's, as the worker's task handlers get it. Tests of a
// job's functions use it to run them with servers of their own.
func NewContext(ctx context.Context, env *Env) context.Context {
	if env != nil {
		ctx = mapreduce.ContextWithLogger(ctx, env.Logger)
	}
	return context.WithValue(ctx, envKey{}, env)
}

// FromContext returns the Env of the worker running the job whose
// function received ctx, and false outside a worker (or NewContext).
func FromContext(ctx context.Context) (*Env, bool) {
	env, ok := ctx.Value(envKey{}).(*Env)
	return env, ok && env != nil
}

var errNoEnv = errors.New("not called from a job run by a batchmr worker (worker.Main or worker.Run); in a test, wrap the context with worker.NewContext")

// Database returns the worker's Postgres pool and the semaphore whose
// permits every query of the fleet takes ("db"), for a job's Split, Map or
// Reduce. It returns an error naming the fix when ctx is not a worker's,
// the worker has no database, or it has no "db" semaphore. The error of a
// worker without a database wraps mapreduce.ErrHandedBack: returned by the
// step, it hands the step back, to be offered again 2.5–7.5 s later, to
// this worker or one that has a database, spending no retry. So a worker
// started without DATABASE_URL slows the runs that healthy workers share
// with it, but fails none; with no worker that has a database, the runs
// stall, their last error naming the fix.
func Database(ctx context.Context) (*pgxpool.Pool, *semaphore.Semaphore, error) {
	env, ok := FromContext(ctx)
	if !ok {
		return nil, nil, fmt.Errorf("worker.Database: %w", errNoEnv)
	}
	if env.DB == nil {
		return nil, nil, fmt.Errorf("worker.Database: this worker has no database: pass --database-url or set DATABASE_URL (Config.DatabaseURL), and set RequireDatabase so that it refuses to start without: %w", mapreduce.ErrHandedBack)
	}
	sem, err := env.semaphore(DBSemaphore)
	if err != nil {
		return nil, nil, fmt.Errorf("worker.Database: %w", err)
	}
	return env.DB, sem, nil
}

// Semaphore returns the worker's fleet-wide semaphore name, for a job's
// Split, Map or Reduce. It returns an error naming the fix when ctx is not
// a worker's or the worker did not open that semaphore (Config.Permits,
// the --permits flag).
func Semaphore(ctx context.Context, name string) (*semaphore.Semaphore, error) {
	env, ok := FromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("worker.Semaphore(%q): %w", name, errNoEnv)
	}
	sem, err := env.semaphore(name)
	if err != nil {
		return nil, fmt.Errorf("worker.Semaphore: %w", err)
	}
	return sem, nil
}

func (e *Env) semaphore(name string) (*semaphore.Semaphore, error) {
	if s, ok := e.Semaphores[name]; ok && s != nil {
		return s, nil
	}
	names := make([]string, 0, len(e.Semaphores))
	for n := range e.Semaphores {
		names = append(names, n)
	}
	slices.Sort(names)
	opened := "none"
	if len(names) > 0 {
		opened = strings.Join(names, ", ")
	}
	return nil, fmt.Errorf("this worker has no semaphore %q (it has: %s): open it with --permits %s=N (Config.Permits); "+
		"in a test through worker.NewContext, put one in Env.Semaphores (semaphore.New)", name, opened, name)
}

// Logger returns the logger of the worker running the job whose function
// received ctx; it is never nil. In a job's Split, Map or Reduce it carries
// the step's attributes: run, job, step, page (Map only), attempt and task
// (see mapreduce.Logger, which returns the same logger). Elsewhere in a
// worker it is the worker's logger (Config.Logger, Env.Logger), and
// slog.Default() outside a worker.
func Logger(ctx context.Context) *slog.Logger {
	return mapreduce.Logger(ctx)
}
