// Command adaptbench proves the semaphore's adaptive limit against a
// Postgres whose CPU changes mid-run. It moves the Postgres server's
// processes into a cgroup v1 CPU group of its own and sets its quota to
// 2 cores (full) or 0.5 core (reduced), while 64 goroutines loop over
// Acquire, a CPU-bound page query, Release. First a sweep of fixed limits
// at each capacity finds each capacity's N* (the smallest N whose
// throughput is within 10% of that capacity's best); then the controller
// (semaphore.RunController with pgsource.Probe) runs three phases,
// full, reduced, full, and the report checks that it settles near N*,
// protects latency, keeps throughput and stays within its bounds.
//
//	scripts/with-servers.sh go run ./internal/bench/adaptbench   (make bench runs it; -quick: ~2 min)
//
// It must run as root on the Postgres server's machine (it reads
// postmaster.pid and writes /sys/fs/cgroup/cpu); it writes Redis keys
// only under a fresh "adaptbench:<random>" prefix and removes them, and
// puts the server's processes back in the root group and removes its
// group at the end, also on Ctrl-C.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/internal/tests/cgroupcpu"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

var (
	redisURL     = flag.String("redis", os.Getenv("BATCHMR_TEST_REDIS_URL"), "Redis URL (default $BATCHMR_TEST_REDIS_URL)")
	dbURL        = flag.String("database-url", os.Getenv("BATCHMR_TEST_DATABASE_URL"), "Postgres URL (default $BATCHMR_TEST_DATABASE_URL); the server must run on this machine")
	quick        = flag.Bool("quick", false, "a smoke run of about 2 minutes: -step 3s -warmup 1s -phase 15s -sweep 1,2,4,8,64")
	goroutines   = flag.Int("goroutines", 64, "goroutines looping over Acquire, query, Release")
	sweepList    = flag.String("sweep", "1,2,4,8,16,32,64", "fixed limits of the sweep, comma-separated")
	step         = flag.Duration("step", 10*time.Second, "measured time of each fixed limit at each capacity")
	warmup       = flag.Duration("warmup", 2*time.Second, "unmeasured time before each measurement, once the queries begun before the change have ended")
	phase        = flag.Duration("phase", 60*time.Second, "length of each of the auto run's phases (full, reduced, full)")
	nStarWithin  = flag.Float64("nstar-within", 0.1, "N* of a capacity is the smallest N whose throughput is within this fraction of the capacity's best (the throughput target's 0.9)")
	queryTarget  = flag.Duration("query", 25*time.Millisecond, "the page query's time at full capacity, alone; calibrated at start")
	queryTimeout = flag.Duration("query-timeout", 0, "bound on each query (0: none)")
	fullQuota    = flag.Int("full", 200000, "full capacity: the Postgres group's cpu.cfs_quota_us per 100000 µs")
	reducedQuota = flag.Int("reduced", 50000, "reduced capacity: the Postgres group's cpu.cfs_quota_us per 100000 µs")
	ctlWindow    = flag.Duration("window", 0, "the controller's window (0: its default)")
	fixedFlag    = flag.Int("fixed", 0, "the operator's fixed N in the auto run (0: N* at full capacity)")
	samplesOut   = flag.String("samples", "", "write the auto run's Stats samples to this CSV file")
	sampleEvery  = flag.Duration("sample-every", 150*time.Millisecond, "how often the auto run samples Stats")
	verbose      = flag.Bool("v", false, "log the controller's messages (debug level)")
)

// autoMax is the auto run's upper bound, and autoMin its lower one.
const autoMin, autoMax = 1, 64

func main() {
	flag.Parse()
	if *quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		defaults := map[string]string{"step": "3s", "warmup": "1s", "phase": "15s", "sweep": "1,2,4,8,64"}
		for name, v := range defaults {
			if !set[name] {
				_ = flag.Set(name, v)
			}
		}
	}
	if *dbURL == "" {
		fmt.Fprintln(os.Stderr, "adaptbench: no database: pass -database-url or set BATCHMR_TEST_DATABASE_URL (make bench does both)")
		os.Exit(2)
	}
	if *nStarWithin < 0 || *nStarWithin >= 1 {
		fmt.Fprintf(os.Stderr, "adaptbench: -nstar-within %g: want a fraction in [0, 1), such as 0.1\n", *nStarWithin)
		os.Exit(2)
	}
	sweep, err := parseSweep(*sweepList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "adaptbench:", err)
		os.Exit(2)
	}
	if err := cgroupcpu.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "adaptbench:", err)
		os.Exit(1)
	}
	rdb := benchutil.Redis("adaptbench", *redisURL, *goroutines+16)
	defer rdb.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, rdb, sweep)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "adaptbench: interrupted; the Postgres server is back in the root CPU group")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "adaptbench:", err)
		os.Exit(1)
	}
}

func parseSweep(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < autoMin || n > autoMax {
			return nil, fmt.Errorf("-sweep %q: want limits from %d to %d, comma-separated", s, autoMin, autoMax)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// bench is one run's state.
type bench struct {
	sem          *semaphore.Semaphore
	rdb          *redis.Client
	pool         *pgxpool.Pool
	group        *cgroupcpu.Group
	load         *load
	full, reduce capacity
}

func run(ctx context.Context, rdb *redis.Client, sweep []int) (err error) {
	outer := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer func() {
		// A run the watch on the servers ended says why.
		if c := context.Cause(ctx); err != nil && c != nil && outer.Err() == nil && !errors.Is(c, context.Canceled) {
			err = fmt.Errorf("%w (%v)", c, err)
		}
	}()
	pool, version, err := openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	go watchServers(ctx, cancel, rdb, pool)

	b := &bench{pool: pool, rdb: rdb,
		full:   capacity{"full", *fullQuota},
		reduce: capacity{"reduced", *reducedQuota},
	}
	postmaster, children, err := postgresProcesses(ctx, pool)
	if err != nil {
		return err
	}
	b.group, err = cgroupcpu.New(fmt.Sprintf("batchmr-adaptbench-%d", os.Getpid()), *goroutines)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := b.group.Remove(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("put the Postgres server back in the root CPU group: %w", rerr))
		}
	}()
	if err := b.capture(postmaster, children); err != nil {
		return err
	}
	// Every connection of the pool now, so that no query waits for one.
	if err := warmPool(ctx, pool, *goroutines); err != nil {
		return err
	}
	rows, med, err := calibrate(ctx, pool, *queryTarget)
	if err != nil {
		return err
	}

	closeSem, err := b.openSemaphore(rdb, sweep[0])
	if err != nil {
		return err
	}
	defer closeSem()

	startLoad := loadAverage()
	b.printHeader(version, postmaster, len(children), rows, med)

	b.load = &load{sem: b.sem, pool: pool, rows: rows, timeout: *queryTimeout}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Go(func() { b.load.run(loadCtx, *goroutines) })
	defer func() {
		stopLoad()
		loadDone.Wait()
	}()

	res, err := b.sweep(ctx, sweep)
	if err != nil {
		return err
	}
	res.print()
	b.load.printErrors("the sweep")
	ar, err := b.auto(ctx, res)
	if err != nil {
		return err
	}
	ar.print(res)
	fmt.Printf("Load average (1, 5, 15 min) at the start: %s; at the end: %s.\n", startLoad, loadAverage())
	return nil
}

// printHeader says what runs where: the date, the server, its group and
// the page query's calibration.
func (b *bench) printHeader(version string, postmaster, children int, rows int64, med time.Duration) {
	host, _ := os.Hostname()
	fmt.Printf("# adaptbench: %s, Postgres %s (postmaster %d and %d children in %s), %d CPUs on %s\n\n",
		time.Now().Format("2006-01-02"), version, postmaster, children, b.group.Dir(),
		runtime.NumCPU(), host)
	fmt.Printf("Page query: `%s` with $1 = %d: %.1f ms alone at full capacity (median of 9, target %v). %d goroutines loop over Acquire, the query, Release; latency is from the grant to the query's end.\n\n",
		pageQuery, rows, ms(med), *queryTarget, *goroutines)
}

// openSemaphore opens the benchmark's semaphore under a fresh prefix;
// closing it deletes its keys.
func (b *bench) openSemaphore(rdb *redis.Client, limit int) (closeSem func(), err error) {
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	prefix := "adaptbench:" + hex.EncodeToString(rb[:])
	b.sem, err = semaphore.New(rdb, "db", semaphore.Options{Limit: limit, Prefix: prefix, Logger: benchLogger()})
	if err != nil {
		return nil, err
	}
	return func() {
		_ = b.sem.Close()
		benchutil.DeleteMatching(rdb, prefix+":*")
	}, nil
}

// benchLogger logs warnings to stderr, everything with -v.
func benchLogger() *slog.Logger {
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// openPool opens the pool of the page queries (and the probe's and the
// checks' connections), without JIT, and reads the server's version.
func openPool(ctx context.Context) (*pgxpool.Pool, string, error) {
	cfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return nil, "", fmt.Errorf("-database-url: %w", err)
	}
	cfg.MaxConns = int32(*goroutines + 4)
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	cfg.ConnConfig.RuntimeParams["application_name"] = "adaptbench"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	var version string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("read the Postgres server's version: %w", err)
	}
	return pool, version, nil
}

// capture sets the group to full capacity and moves the postmaster and
// its children into it.
func (b *bench) capture(postmaster int, children []int) error {
	if err := b.group.SetCores(b.full.cores()); err != nil {
		return err
	}
	for _, pid := range append([]int{postmaster}, children...) {
		if err := b.group.Add(pid); err != nil {
			return err
		}
	}
	return nil
}

// watchServers ends the run, with the cause, once Redis or Postgres has
// not answered for about 10 seconds (its servers were stopped under it).
func watchServers(ctx context.Context, cancel context.CancelCauseFunc, rdb *redis.Client, pool *pgxpool.Pool) {
	failed := 0
	for sleep(ctx, 2*time.Second) == nil {
		pctx, done := context.WithTimeout(ctx, 2*time.Second)
		err := errors.Join(rdb.Ping(pctx).Err(), pool.Ping(pctx))
		done()
		if err == nil || ctx.Err() != nil {
			failed = 0
			continue
		}
		if failed++; failed == 5 {
			cancel(fmt.Errorf("the servers stopped answering: %w", err))
			return
		}
	}
}

// warmPool opens n connections of pool at once.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("open %d Postgres connections: %w (raise max_connections?)", n, err)
		}
		conns = append(conns, c)
	}
	return nil
}

// calibrate finds the $1 that makes the page query take target alone,
// and returns it with the query's median time at it.
func calibrate(ctx context.Context, pool *pgxpool.Pool, target time.Duration) (int64, time.Duration, error) {
	rows := int64(200_000)
	var med time.Duration
	for i := range 4 {
		samples := 5
		if i == 3 {
			samples = 9
		}
		var ds []time.Duration
		for range samples {
			t := time.Now()
			var n int64
			if err := pool.QueryRow(ctx, pageQuery, rows).Scan(&n); err != nil {
				return 0, 0, fmt.Errorf("calibrate the page query: %w", err)
			}
			ds = append(ds, time.Since(t))
		}
		med = benchutil.Median(ds)
		if i < 3 {
			rows = max(1000, int64(float64(rows)*float64(target)/float64(med)))
		}
	}
	return rows, med, nil
}

// loadAverage returns the machine's load averages over 1, 5 and 15
// minutes: above the CPU count, something besides this run competes.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
