// Package worker is batchmr's worker runtime: a worker binary is your jobs
// plus one call.
//
//	package main
//
//	import (
//		"example.com/reports/countkinds"
//		"github.com/batchmr/batchmr/pkg/worker"
//	)
//
//	func main() { worker.Main(countkinds.Job) }
//
// Main reads its flags and their environment variables (REDIS_URL,
// DATABASE_URL, --concurrency, --db-permits, ...; --help lists them),
// connects to Redis and Postgres with errors that name the fix, opens the
// fleet-wide semaphores, runs an asynq server on the jobs' own queues,
// repairs runs that crashes left behind, announces the jobs so that
// 'scheduler run JOB' starts them without being rebuilt, logs with slog
// (asynq's records too; --log-level, --log-format), and on SIGTERM lets
// in-flight tasks finish and releases its permits before it exits. Run
// does the same under a context, for programs that build their Config
// themselves.
//
// A job is a plain mapreduce.Job value: what it needs at run time comes
// from the worker through its functions' context, so any process can hold
// the job, start runs of it (Job.Start) and decode their results without
// connecting to a database:
//
//	Map: func(ctx context.Context, r pgsource.KeyRange) ([]Count, error) {
//		db, permits, err := worker.Database(ctx) // the pool, and the "db" semaphore
//		if err != nil {
//			return nil, err
//		}
//		return pgsource.Fetch(ctx, db, permits, query, r, pgx.RowToStructByPos[Count])
//	},
//
// Logger(ctx) is the worker's logger with the step's run, job, step, page,
// attempt and task: what a job logs through it says which page it is
// about. docs/operations.md lists what the worker logs at which level.
package worker
