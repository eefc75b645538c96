// Package mapreduce runs MapReduce-style batch jobs on asynq: a split task
// streams a run's pages, map tasks process them on any worker of the fleet
// (a task per page, or, for pages whose Map averages under a millisecond,
// several: up to 64, JobOptions.PagesPerTask), and when the last page is
// recorded one reduce step combines the results.
//
// A job is a value: a name and three functions over plain Go values. What
// the functions need at run time (a database pool, semaphores) comes from
// the worker that runs them, through their context (package worker), so
// the job can live in a package of its own:
//
//	var NightlyTotals = mapreduce.Job[Args, Page, Result, Total]{
//		Name:     "nightly-totals",
//		Validate: func(a Args) error { ... },  // optional: refuse bad arguments at Start
//		Split:    func(ctx context.Context, a Args, emit func(Page) error) error { ... },
//		Map:      func(ctx context.Context, p Page) (Result, error) { ... },
//		Reduce:   func(ctx context.Context, a Args, pages iter.Seq2[mapreduce.PageResult[Page, Result], error]) (Total, error) { ... },
//	}
//
// A worker runs it; worker.Main does all of it in one call:
//
//	func main() { worker.Main(NightlyTotals) }
//
// Any process starts runs and reads their results, typed, with a Client
// that runs no job:
//
//	mr, err := mapreduce.New(rdb, mapreduce.Config{})
//	id, err := NightlyTotals.Start(ctx, mr, Args{Day: day}, mapreduce.StartOptions{})
//	st, err := mr.Wait(ctx, id)             // st.State, st.Done, st.Failed
//	total, err := NightlyTotals.Result(st)  // a Total
//	err = mr.Retry(ctx, id)                 // if it failed: run its failed pages again
//
// and a process without the job's Go code (cmd/scheduler) starts any job
// that a worker announced, from JSON (StartJSON; Jobs lists them).
//
// To run jobs on an asynq server of your own instead of worker.Main, let
// the client complete the server's config (ServerConfig: the jobs'
// queues, their retry delays, outages not counted as failures, a 100 ms
// poll where asynq's default is a second) and register it on the mux:
//
//	mr, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs}) // jobs: NewJobs, AddJob
//	cfg, err := mr.ServerConfig(asynq.Config{Concurrency: 20})
//	srv := asynq.NewServerFromRedisClient(rdb, cfg)
//	mux := asynq.NewServeMux()
//	mr.Register(mux)
//	go mr.RunReconciler(ctx, 30*time.Second)
//	go mr.Announce(ctx, mr.NewWorkerInfo())
//	err = srv.Run(mux)
//
// What a run guarantees (docs/mapreduce.md has the state machine and the
// keys):
//   - Map runs at least once per page; each page's outcome is recorded
//     exactly once, whatever the retries, crashes and duplicate deliveries.
//     Write Map to be idempotent.
//   - Reduce starts only after every page is recorded — the total is
//     written only when the split has enqueued every page, so pages that
//     finish while the split is still running cannot trigger it — and the
//     run records one outcome.
//   - A worker killed mid-split, mid-map or mid-reduce loses nothing: the
//     reconciler copies a task that asynq shows as active while no live
//     worker holds it, within seconds, and every step is idempotent.
//   - Outages cost time, not runs: an error IsTransient reports (the
//     database or Redis unreachable, a failover, a serialization failure)
//     is retried with JobOptions.TransientBackoff without spending the
//     job's retries, and handlers wait out a Redis outage before they
//     return. Every failed attempt is logged with its run, job, page and
//     attempt, and Logger(ctx) gives a job's functions a logger with the
//     same attributes.
//   - A run of any size holds at most JobOptions.Window pages' tasks in
//     Redis at once: the split enqueues pages as earlier ones are recorded,
//     and tops its queue up only to a short backlog, so a run started
//     behind a large one of the same job waits behind that backlog, not
//     behind the large run. A split that starts again skips the pages an
//     earlier attempt enqueued or recorded.
//   - Starts with the same StartOptions.Key make one run, so scheduler
//     replicas firing on the same tick start it once.
//   - Cancel stops a run: queued pages do not start, handlers at work see
//     their context cancelled with cause ErrRunCancelled within
//     Config.CancelPoll.
//   - Retry resumes a run that failed or was cancelled: only its failed and
//     unfinished pages run again, then Reduce runs once more, still
//     recording each page once. A run whose pages failed during a database
//     outage costs the outage, not the run.
//   - A page that fails for good is reported to Reduce with its error
//     (CompleteSemantics) or fails the run naming it (SuccessSemantics, the
//     default).
//
// A finished run's keys expire after JobOptions.Retention (24h by default).
package mapreduce
