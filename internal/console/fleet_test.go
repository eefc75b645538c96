package console_test

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/internal/tests/testenv/testhost"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// quiet is the logger of the tests' clients and consoles: errors only.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// fleet is one test's deployment: the test Redis under a prefix of its
// own, workers in the test's process, and a console over it all.
type fleet struct {
	t      *testing.T
	rdb    *redis.Client
	prefix string
	mr     *mapreduce.Client // runs no job: the console's, and the test's
	con    *console.Console
	srv    *httptest.Server
}

// newFleet starts a console with cfg (its Redis, client and prefixes
// filled in) behind an httptest server, sampling every 100ms.
func newFleet(t *testing.T, cfg console.Config) *fleet {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Redis, cfg.MapReduce, cfg.Prefix, cfg.SemaphorePrefix, cfg.Logger = rdb, mr, prefix, prefix+":sem", quiet
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = 100 * time.Millisecond
	}
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() { con.Sample(ctx); close(sampled) }()
	srv := httptest.NewServer(con)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-sampled
		_ = con.Close()
	})
	return &fleet{t: t, rdb: rdb, prefix: prefix, mr: mr, con: con, srv: srv}
}

// semaphore opens the fleet's semaphore name with the given limit (the
// first limit written wins, as in a worker).
func (f *fleet) semaphore(name string, limit int) *semaphore.Semaphore {
	f.t.Helper()
	s, err := semaphore.New(f.rdb, name, semaphore.Options{Limit: limit, Prefix: f.prefix + ":sem", Logger: quiet})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}

// host runs jobs as a worker does — an asynq server of the given
// concurrency on the jobs' queues, announced in the catalogue with sems —
// until the test ends. It returns once the catalogue lists the worker.
func (f *fleet) host(concurrency int, sems []string, jobs ...mapreduce.AnyJob) {
	f.t.Helper()
	f.hostWith(testhost.Options{Concurrency: concurrency, Semaphores: sems}, jobs...)
}

// hostWith is host with the worker's options (the fleet's prefix and a
// quiet logger filled in).
func (f *fleet) hostWith(o testhost.Options, jobs ...mapreduce.AnyJob) mapreduce.WorkerInfo {
	f.t.Helper()
	o.Prefix, o.Logger = f.prefix, quiet
	info, _ := testhost.Host(f.t, f.rdb, o, jobs...)
	return info
}

// workArgs are the arguments of the tests' job: N pages of SleepMS each.
type workArgs struct {
	N       int `json:"n"`
	SleepMS int `json:"sleep_ms"`
}

// workJob is a job of N pages (page i is [i, SleepMS]) that each sleep SleepMS, holding a permit
// of sem when sem is not nil; page i fails for good with fail(i) when
// fail is not nil and returns an error. Its result is the number of pages.
func workJob(name string, sem *semaphore.Semaphore, fail func(i int) error) mapreduce.Job[workArgs, [2]int, int, int] {
	return mapreduce.Job[workArgs, [2]int, int, int]{
		Name: name,
		Split: func(ctx context.Context, a workArgs, emit func([2]int) error) error {
			for i := range a.N {
				if err := emit([2]int{i, a.SleepMS}); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(ctx context.Context, p [2]int) (int, error) {
			if fail != nil {
				if err := fail(p[0]); err != nil {
					return 0, err
				}
			}
			work := func(ctx context.Context) error {
				select {
				case <-time.After(time.Duration(p[1]) * time.Millisecond):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if sem != nil {
				return 1, sem.Do(ctx, work)
			}
			return 1, work(ctx)
		},
		Reduce: func(ctx context.Context, a workArgs, pages iter.Seq2[mapreduce.PageResult[[2]int, int], error]) (int, error) {
			n := 0
			for pr, err := range pages {
				if err != nil {
					return 0, err
				}
				n += pr.Result
			}
			return n, nil
		},
		Options: mapreduce.JobOptions{MapRetries: -1, StepRetries: -1},
	}
}

// start starts a run of job and returns its ID.
func (f *fleet) start(job string, a workArgs) string {
	f.t.Helper()
	id, err := f.mr.StartJSON(context.Background(), job, []byte(fmt.Sprintf(`{"n":%d,"sleep_ms":%d}`, a.N, a.SleepMS)), mapreduce.StartOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	// Before the workers stop (cleanups run last first), so that no page
	// keeps one waiting.
	f.t.Cleanup(func() { _ = f.mr.Cancel(context.Background(), id) })
	return id
}

// status reads a run's status.
func (f *fleet) status(id string) *mapreduce.Status {
	f.t.Helper()
	st, err := f.mr.Status(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}
