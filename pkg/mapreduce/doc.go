// Package mapreduce runs MapReduce-style batch jobs on asynq: a split task
// streams a run's pages, one map task per page processes it on any worker
// of the fleet, and when the last page is recorded one reduce step combines
// the results.
//
// A job is a name and three functions over plain Go values:
//
//	jobs := mapreduce.NewJobs()
//	err := mapreduce.AddJob(jobs, mapreduce.Job[Args, Page, Result, Total]{
//		Name:   "nightly-totals",
//		Split:  func(ctx context.Context, a Args, emit func(Page) error) error { ... },
//		Map:    func(ctx context.Context, p Page) (Result, error) { ... },
//		Reduce: func(ctx context.Context, a Args, pages iter.Seq2[mapreduce.PageResult[Page, Result], error]) (Total, error) { ... },
//	})
//
// A worker is an ordinary asynq server with the client registered on its mux:
//
//	mr, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs})
//	mux := asynq.NewServeMux()
//	mr.Register(mux)
//	go mr.RunReconciler(ctx, 30*time.Second)
//	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
//		Queues:         map[string]int{"default": 1},
//		RetryDelayFunc: mr.RetryDelay, // each job's JobOptions.Backoff
//	})
//	err = srv.Run(mux)
//
// and any process with the same registry starts and follows runs:
//
//	id, err := mr.Start(ctx, "nightly-totals", Args{Day: day}, mapreduce.StartOptions{})
//	st, err := mr.Wait(ctx, id) // st.State, st.Done, st.Failed, st.Result
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
//   - A worker killed mid-split, mid-map or mid-reduce loses nothing:
//     asynq hands its task to another worker, and every step is idempotent.
//   - Starts with the same StartOptions.Key make one run, so scheduler
//     replicas firing on the same tick start it once.
//   - Cancel stops a run: queued pages do not start, handlers at work see
//     their context cancelled with cause ErrRunCancelled within
//     Config.CancelPoll.
//   - A page that fails for good is reported to Reduce with its error
//     (CompleteSemantics) or fails the run naming it (SuccessSemantics, the
//     default).
//
// A finished run's keys expire after JobOptions.Retention (24h by default).
package mapreduce
