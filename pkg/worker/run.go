package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/metrics"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Run runs jobs until ctx is done, then shuts down gracefully and returns
// nil: it stops taking tasks, lets in-flight ones finish within
// Config.ShutdownTimeout (handing the rest back to their queues), releases
// its permits and takes itself off the catalogue's list of workers (a job
// stays listed, with the workers that still run it, until 'scheduler jobs
// forget').
//
// It connects to Redis and, with a DatabaseURL, to Postgres, and returns at
// once with an error naming the problem and the fix when it cannot, when
// cfg is invalid, or when a job is (a bad name or options, two jobs of one
// name, none at all). Once running, it:
//   - serves each job's own asynq queue (weights from Config.Weights), so
//     that no task of another job reaches it, and hands back without
//     failing anything a task that does;
//   - opens the semaphores of Config.Permits and hands them, the database
//     pool and the logger to the jobs' functions (Database, Semaphore,
//     Logger);
//   - announces its jobs in the catalogue with a heartbeat, so that
//     'scheduler run JOB' works for them without rebuilding the scheduler,
//     and checks the arguments of runs started from the command line;
//   - repairs runs that crashes left behind every Config.ReconcileEvery,
//     and copies tasks that asynq shows as active while no live worker
//     holds them every few seconds.
//
// It refuses to start on a host whose clock is more than
// Config.MaxClockOffset away from Redis's.
func Run(ctx context.Context, cfg Config, jobs ...mapreduce.AnyJob) error {
	w, err := start(ctx, cfg, jobs)
	if err != nil {
		return err
	}
	<-ctx.Done()
	w.stop()
	return nil
}

// running is a started worker.
type running struct {
	cfg    Config
	rdb    redis.UniversalClient
	env    *Env
	srv    *asynq.Server
	cancel context.CancelFunc
	done   chan struct{} // closed when the announcer has withdrawn
	closes []func()
	auto   map[string]bool // semaphores watchLimits saw in auto mode
}

func start(ctx context.Context, cfg Config, jobs []mapreduce.AnyJob) (_ *running, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	registry, err := newRegistry(jobs)
	if err != nil {
		return nil, err
	}
	w := &running{cfg: cfg, auto: map[string]bool{}}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if err := w.connectRedis(ctx); err != nil {
		return nil, err
	}
	ln, err := w.listenMetrics()
	if err != nil {
		return nil, err
	}
	obs := metrics.NewObserver()
	w.env = &Env{Redis: w.rdb, Logger: cfg.Logger, Semaphores: map[string]*semaphore.Semaphore{}}
	// Queries on the pool without a permit of the worker's semaphores
	// ("db", as a rule) are warned of: they take the fleet over its permits.
	unguarded := &Unguarded{}
	if err := w.openDatabase(ctx, unguarded); err != nil {
		return nil, err
	}
	if err := w.openSemaphores(obs, unguarded); err != nil {
		return nil, err
	}
	mr, err := mapreduce.New(w.rdb, mapreduce.Config{Jobs: registry, Prefix: cfg.Prefix, Logger: cfg.Logger,
		Observer: mapreduce.Observers(obs, cfg.Observer)})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	queues, err := mr.Queues(cfg.Weights)
	if err != nil {
		return nil, fmt.Errorf("worker: --weight: %w", err)
	}
	if err := w.startServer(mr, queues, ln, obs); err != nil {
		return nil, err
	}
	w.startBackground(ctx, mr, queues, registry)
	return w, nil
}

// newRegistry registers jobs, refusing none at all.
func newRegistry(jobs []mapreduce.AnyJob) (*mapreduce.Jobs, error) {
	registry := mapreduce.NewJobs()
	for _, j := range jobs {
		if err := registry.Add(j); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	if len(registry.Names()) == 0 {
		return nil, errors.New("worker: no jobs: pass your jobs to worker.Main or worker.Run")
	}
	return registry, nil
}

// connectRedis connects to Redis and refuses a host whose clock is more
// than MaxClockOffset away from Redis's.
func (w *running) connectRedis(ctx context.Context) (err error) {
	if w.rdb, err = app.Redis(ctx, w.cfg.RedisURL, w.cfg.redisTLS(), w.cfg.Logger); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.closes = append(w.closes, func() { _ = w.rdb.Close() })
	off, err := app.ClockOffset(ctx, w.rdb, w.cfg.now)
	if err != nil {
		return fmt.Errorf("worker: reading Redis's clock: %w", err)
	}
	if err := clockError(off, w.cfg.MaxClockOffset); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// listenMetrics returns the metrics listener, nil when the worker serves
// no metrics. It binds before anything else starts, so that a port in use
// fails the start with a message, not a log line later.
func (w *running) listenMetrics() (ln net.Listener, err error) {
	if ln = w.cfg.metricsListener; ln == nil && w.cfg.MetricsAddr != "" {
		if ln, err = net.Listen("tcp", w.cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("worker: --metrics-addr %s: %w: choose a free port, or leave it empty to serve no metrics", w.cfg.MetricsAddr, err)
		}
	}
	if ln != nil {
		w.closes = append(w.closes, func() { _ = ln.Close() })
	}
	return ln, nil
}

// openDatabase opens the jobs' Postgres pool, if the worker has a
// DatabaseURL, with unguarded tracing its queries.
func (w *running) openDatabase(ctx context.Context, unguarded *Unguarded) (err error) {
	cfg := w.cfg
	if cfg.DatabaseURL == "" {
		return nil
	}
	if warning := app.PostgresTLSWarning(cfg.DatabaseURL); warning != "" {
		cfg.Logger.Warn("worker: " + warning)
	}
	// A connection per task at work, and a few for splits and reduces.
	if w.env.DB, err = app.Postgres(ctx, cfg.DatabaseURL, cfg.ApplicationName, cfg.Concurrency+4, func(pc *pgxpool.Config) {
		// A cancelled query is cancelled on the server and its
		// connection kept, so that its permit can go back at once.
		pgsource.ConfigurePool(pc)
		pc.ConnConfig.Tracer = unguarded
	}); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.closes = append(w.closes, w.env.DB.Close)
	return nil
}

// openSemaphores opens the semaphores of Config.Permits for the jobs, and
// has unguarded count their permits as guards.
func (w *running) openSemaphores(obs *metrics.Observer, unguarded *Unguarded) error {
	cfg := w.cfg
	for _, name := range slices.Sorted(maps.Keys(cfg.Permits)) {
		sem, err := semaphore.New(w.rdb, name, semaphore.Options{Limit: cfg.Permits[name], Lease: cfg.Lease,
			Prefix: app.SemaphorePrefix(cfg.Prefix), Logger: cfg.Logger, Observer: obs})
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		w.env.Semaphores[name] = sem
		unguarded.Guard(sem)
		// Closed (in reverse) before the pool and Redis: releases what is still held.
		w.closes = append(w.closes, func() { _ = sem.Close() })
	}
	return nil
}

// startServer starts the asynq server on queues, and the metrics server
// on ln if not nil.
func (w *running) startServer(mr *mapreduce.Client, queues map[string]int, ln net.Listener, obs *metrics.Observer) error {
	cfg, log := w.cfg, w.cfg.Logger
	// asynq's lines of a Redis outage: one when it starts, one when the
	// worker's client sees Redis answer again.
	asynqOutages := outage.New(log.With("component", "asynq"), "worker: asynq")
	w.rdb.AddHook(redisBack{asynqOutages})
	scfg, err := mr.ServerConfig(asynq.Config{
		Concurrency:       cfg.Concurrency,
		TaskCheckInterval: cfg.PollInterval,
		Queues:            queues,
		ShutdownTimeout:   cfg.ShutdownTimeout,
		BaseContext:       func() context.Context { return NewContext(context.Background(), w.env) },
		Logger:            asynqLogger{log: log, outages: asynqOutages},
		LogLevel:          asynqLevel(log),
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.srv = asynq.NewServerFromRedisClient(w.rdb, scfg)
	if ln != nil {
		sems := make([]*semaphore.Semaphore, 0, len(w.env.Semaphores))
		for _, name := range slices.Sorted(maps.Keys(w.env.Semaphores)) {
			sems = append(sems, w.env.Semaphores[name])
		}
		w.serveMetrics(ln, obs, mr, sems)
	}
	mux := asynq.NewServeMux()
	mr.Register(mux)
	if err := w.srv.Start(mux); err != nil {
		return fmt.Errorf("worker: starting the asynq server: %w", err)
	}
	return nil
}

// startBackground starts the worker's background work, which runs until
// stop: the reconciler, the watches of the clock and the limits, the
// candidacy for the database permits' controller (auto mode) and the
// announcement in the catalogue; then logs the start.
func (w *running) startBackground(ctx context.Context, mr *mapreduce.Client, queues map[string]int, registry *mapreduce.Jobs) {
	cfg, log := w.cfg, w.cfg.Logger
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = cancel
	w.done = make(chan struct{})
	info := mr.NewWorkerInfo()
	info.Queues = queues
	info.Semaphores = slices.Sorted(maps.Keys(cfg.Permits))
	hasDB := w.env.DB != nil
	info.Database = &hasDB
	info.Version = cfg.Version
	if info.Version == "" {
		info.Version = "batchmr " + app.BuildVersion()
	}
	limits := w.limits(ctx)
	go mr.RunReconciler(bg, cfg.ReconcileEvery)
	go w.watchClock(bg)
	go w.watchLimits(bg, maps.Clone(limits))
	if sem := w.env.Semaphores[DBSemaphore]; sem != nil && w.env.DB != nil {
		// A candidate for the database permits' controller (auto mode).
		probe := pgsource.NewProbe(w.env.DB)
		w.closes = append(w.closes, probe.Close)
		go func() { _ = sem.RunController(bg, semaphore.ControllerOptions{Probe: probe.Run}) }()
	}
	go func() {
		defer close(w.done)
		_ = mr.Announce(bg, info)
	}()
	log.Info("worker: started", "worker", info.ID, "jobs", registry.Names(), "queues", queues,
		"concurrency", cfg.Concurrency, "permits", limits, "permits_if_unset", cfg.Permits)
	if cfg.DatabaseURL == "" {
		log.Warn("worker: this worker has no database (--database-url, DATABASE_URL): a job that calls worker.Database hands the pages it takes here back to the queue, to be offered again 2.5–7.5 s later; " +
			"if its jobs query Postgres, give it one, and set Config.RequireDatabase so that it refuses to start without")
	}
}

// stop shuts the worker down: the server first (in-flight tasks finish or
// go back), then the announcement, the pool, the semaphores and Redis.
func (w *running) stop() {
	w.cfg.Logger.Info("worker: stopping", "shutdown_timeout", w.cfg.ShutdownTimeout)
	// Pages still waiting for a permit go back at once, for the rest of
	// the fleet, rather than start their queries during the shutdown or
	// hold it for ShutdownTimeout; pages whose queries run finish.
	for _, sem := range w.env.Semaphores {
		sem.Drain()
	}
	w.srv.Shutdown()
	w.cancel()
	<-w.done
	w.drainPool()
	w.close()
	w.cfg.Logger.Info("worker: stopped")
}

// drainPool closes the database pool, waiting for its connections, before
// the semaphores are closed. asynq's Shutdown returns after
// ShutdownTimeout even while handlers still run: it hands their tasks back
// and cancels their contexts, but does not wait for them. A handler's
// query under a permit (pgsource) gives its connection back only once the
// query is gone from the server, and its permit after that; closing a
// semaphore first would give back at once every permit still held here,
// with those queries possibly still running. The wait is bounded by what
// pgsource may take to make sure (one lease after pgx's 5s cancel
// deadline), so that a handler that keeps a connection and ignores its
// context does not keep the fleet's permits for ever: the semaphores then
// close anyway, and the pool's Close in close waits for that connection.
func (w *running) drainPool() {
	if w.env.DB == nil {
		return
	}
	closed := make(chan struct{})
	go func() {
		w.env.DB.Close()
		close(closed)
	}()
	bound := w.cfg.Lease + 10*time.Second
	select {
	case <-closed:
	case <-time.After(bound):
		w.cfg.Logger.Warn("worker: database connections still in use after the shutdown timeout and one lease: releasing the permits anyway; their queries may still run",
			"waited", bound, "in_use", w.env.DB.Stat().AcquiredConns())
	}
}

func (w *running) close() {
	for i := len(w.closes) - 1; i >= 0; i-- {
		w.closes[i]()
	}
	w.closes = nil
}
