// Command mrbench measures pkg/mapreduce against a real Redis and prints
// Markdown tables for BENCHMARKS.md:
//
//   - scale: runs of no-op pages of growing size (-sizes), the first size
//     run again after the others so that drift shows: end-to-end pages/s,
//     the ratio of each size's rate to the first's, Redis memory at the
//     live run's peak above idle, and the most tasks asynq held at once
//     against the window;
//
//   - fairness: a small run (-small pages) of the same job alone, then
//     started while the largest run is half done: its time, and the ratio;
//
//   - overhead: the framework against a bare asynq handler processing the
//     same number of no-op tasks, in interleaved rounds: median and spread,
//     for a run as it packs pages by default, and for one that takes a
//     task a page (PagesPerTask 1).
//
//     go run ./internal/bench/mrbench -redis redis://127.0.0.1:6379/0
//
// It writes only under a fresh "mrbench:<random>" prefix and its own asynq
// queues, and deletes them afterwards.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

var (
	redisURL    = flag.String("redis", os.Getenv("BATCHMR_TEST_REDIS_URL"), "Redis URL (default $BATCHMR_TEST_REDIS_URL)")
	sizes       = flag.String("sizes", "100000,1000000", "pages of the scale runs, comma-separated; the first is the reference, run again at the end")
	window      = flag.Int("window", 0, "JobOptions.Window of every run (0: the default)")
	small       = flag.Int("small", 1000, "pages of the fairness section's small runs")
	smallRuns   = flag.Int("small-runs", 3, "small runs alone, and started one after another from half-way through the largest run; medians are reported")
	tasks       = flag.Int("tasks", 20_000, "no-op tasks per overhead comparison round")
	repeat      = flag.Int("repeat", 5, "interleaved rounds of the overhead comparison")
	concurrency = flag.Int("concurrency", 32, "asynq worker concurrency in every measurement")
	only        = flag.String("only", "", "run only these sections, comma-separated: scale,fairness,overhead,idle (fairness runs with scale)")
	enqueueConc = flag.Int("enqueue-concurrency", 0, "mapreduce.Config.EnqueueConcurrency of every run (0: the default)")
	perTask     = flag.Int("pages-per-task", 0, "JobOptions.PagesPerTask of the scale and fairness runs (0: the default, packing; 1: a task a page)")
	cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the whole benchmark (worker and client: one process) to this file")
	poll        = flag.Duration("poll-interval", 10*time.Millisecond, "asynq's TaskCheckInterval: how long a handler slot that found its queue empty sleeps (the worker command's --poll-interval, 100ms by default)")
)

func main() {
	flag.Parse()
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "mrbench: -sizes %q: want page counts above 0, comma-separated, such as 100000,1000000\n", *sizes)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	rdb := benchutil.Redis("mrbench", *redisURL, 4**concurrency)
	defer rdb.Close()
	ctx := context.Background()
	base := fmt.Sprintf("mrbench:%08x", rand.Uint32())
	var queues []string
	defer func() { cleanup(rdb, base, queues) }()
	info, _ := rdb.Info(ctx, "server").Result()
	fmt.Printf("# mrbench: %s, Go %s, %d CPUs, Redis %s, asynq concurrency %d\n\n", time.Now().Format("2006-01-02"),
		runtime.Version(), runtime.NumCPU(), benchutil.InfoField(info, "redis_version"), *concurrency)

	want := func(s string) bool { return *only == "" || slices.Contains(strings.Split(*only, ","), s) }
	if want("scale") || want("fairness") {
		q := base + "-scale"
		queues = append(queues, q)
		scale(ctx, rdb, base+":scale", q, ns, want("scale"), want("fairness"))
	}
	if want("overhead") {
		overhead(ctx, rdb, base, &queues)
	}
	if want("idle") {
		idle(ctx, rdb, base, &queues)
	}
}

// overhead runs the overhead section: in each round, a bare asynq handler,
// then a mapreduce run as it packs by default, then one that takes a task
// a page (PagesPerTask 1), each over -tasks no-op tasks or pages.
func overhead(ctx context.Context, rdb *redis.Client, base string, queues *[]string) {
	sides := []struct {
		name, label string
		perTask     int
	}{
		{"bare asynq", "bare", 0},
		{"mapreduce run (default: packs)", "mapreduce", 0},
		{"mapreduce run, PagesPerTask 1", "mapreduce-1", 1},
	}
	times := make([][]time.Duration, len(sides))
	uses := make([][]benchutil.Use, len(sides))
	for r := range *repeat {
		for i, side := range sides {
			q := fmt.Sprintf("%s-%s-%d", base, side.label, r)
			*queues = append(*queues, q)
			u0 := benchutil.TakeUse(ctx, rdb)
			var d time.Duration
			// Labels tell the sides apart in a -cpuprofile: pprof -tagfocus round=bare (or mapreduce, mapreduce-1).
			pprof.Do(ctx, pprof.Labels("round", side.label), func(ctx context.Context) {
				if i == 0 {
					d = bareRound(ctx, rdb, q)
				} else {
					d = mapreduceRound(ctx, rdb, fmt.Sprintf("%s:%s%d", base, side.label, r), q, *tasks, side.perTask)
				}
			})
			times[i], uses[i] = append(times[i], d), append(uses[i], benchutil.TakeUse(ctx, rdb).Sub(u0))
		}
	}
	fmt.Printf("## Framework overhead: %d no-op tasks, bare asynq handler vs a mapreduce run of as many pages (%d interleaved rounds)\n\n", *tasks, *repeat)
	fmt.Printf("| | %s | %s | ratio (target ≤ 1.25) | %s | ratio |\n", sides[0].name, sides[1].name, sides[2].name)
	fmt.Println("|---|---|---|---|---|---|")
	b, m, m1 := benchutil.Median(times[0]), benchutil.Median(times[1]), benchutil.Median(times[2])
	fmt.Printf("| wall time, median | %v | %v | **%.2f** (ratio of medians) | %v | %.2f |\n", b.Round(time.Millisecond),
		m.Round(time.Millisecond), float64(m)/float64(b), m1.Round(time.Millisecond), float64(m1)/float64(b))
	fmt.Printf("| pages (tasks) /s, median | %.0f | %.0f | | %.0f | |\n", float64(*tasks)/b.Seconds(), float64(*tasks)/m.Seconds(), float64(*tasks)/m1.Seconds())
	perPage := func(name, unit string, f func(benchutil.Use) float64) {
		med := make([]float64, len(sides))
		for i := range sides {
			var vs []float64
			for _, u := range uses[i] {
				vs = append(vs, f(u)/float64(*tasks))
			}
			med[i] = benchutil.Median(vs)
		}
		fmt.Printf("| %s per page, median | %.1f%s | %.1f%s | %.2f | %.1f%s | %.2f |\n", name, med[0], unit, med[1], unit, med[1]/med[0], med[2], unit, med[2]/med[0])
	}
	perPage("Redis CPU", " µs", func(u benchutil.Use) float64 { return micros(u.RedisCPU) })
	perPage("worker CPU (this process: asynq client and server, handlers)", " µs", func(u benchutil.Use) float64 { return micros(u.OwnCPU) })
	perPage("Redis round trips (client reads)", "", func(u benchutil.Use) float64 { return float64(u.Reads) })
	perPage("Redis commands (scripts' calls included)", "", func(u benchutil.Use) float64 { return float64(u.Commands) })
	ratios := func(side int) []float64 {
		var rs []float64
		for r := range times[0] {
			rs = append(rs, float64(times[side][r])/float64(times[0][r]))
		}
		return rs
	}
	r, r1 := ratios(1), ratios(2)
	fmt.Printf("| per round | %s | %s | %s (median **%.2f**, spread %.2f–%.2f) | %s | %s (median %.2f, spread %.2f–%.2f) |\n\n",
		durs(times[0]), durs(times[1]), benchutil.Floats(r, 2), benchutil.Median(r), slices.Min(r), slices.Max(r),
		durs(times[2]), benchutil.Floats(r1, 2), benchutil.Median(r1), slices.Min(r1), slices.Max(r1))
}

func newServer(rdb redis.UniversalClient, queue string) *asynq.Server {
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:       *concurrency,
		Queues:            map[string]int{queue: 1},
		TaskCheckInterval: *poll,
		LogLevel:          asynq.ErrorLevel,
	})
}

// noop is the job of both sections: a split of n pages, a Map that does
// nothing, a Reduce that counts.
func noopJobs(queue string, pagesPerTask int) *mapreduce.Jobs {
	jobs := mapreduce.NewJobs()
	must(mapreduce.AddJob(jobs, noopJob(queue, pagesPerTask)))
	return jobs
}

// noopJob is a job of n pages whose Map does nothing, with
// JobOptions.PagesPerTask pagesPerTask.
func noopJob(queue string, pagesPerTask int) mapreduce.Job[int, int, struct{}, int] {
	return mapreduce.Job[int, int, struct{}, int]{
		Name: "noop",
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(context.Context, int) (struct{}, error) { return struct{}{}, nil },
		Options: mapreduce.JobOptions{Queue: queue, Retention: time.Minute, Window: *window, AllowOverlap: true,
			Semantics: mapreduce.CompleteSemantics, MapRetries: -1, PagesPerTask: pagesPerTask},
	}
}

func newClient(rdb *redis.Client, prefix, queue string, pagesPerTask int) *mapreduce.Client {
	c, err := mapreduce.New(rdb, mapreduce.Config{Jobs: noopJobs(queue, pagesPerTask), Prefix: prefix, EnqueueConcurrency: *enqueueConc,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	must(err)
	return c
}

// run starts a run of n pages and returns its final status, polling every
// 5 ms so that the poll does not pad the time; during sees each status.
func run(ctx context.Context, rdb *redis.Client, c *mapreduce.Client, queue string, n int, during func(*mapreduce.Status)) *mapreduce.Status {
	id, err := noopJob(queue, 0).Start(ctx, c, n, mapreduce.StartOptions{})
	must(err)
	for {
		st, err := c.Status(ctx, id)
		must(err)
		if during != nil {
			during(st)
		}
		if st.State.Ended() {
			if st.State != mapreduce.StateSucceeded {
				must(fmt.Errorf("run %s ended %s: %s", id, st.State, st.Error))
			}
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sample is what the scale section watches while a run goes: Redis
// memory and the tasks asynq holds for the run's queue.
type sample struct {
	peakMem   int64 // bytes above idle
	peakTasks int   // pending, active, retrying and scheduled
	samples   int
}

func (s *sample) take(ctx context.Context, rdb *redis.Client, queue string, idle int64) {
	s.samples++
	s.peakMem = max(s.peakMem, usedMemory(ctx, rdb)-idle)
	base := "asynq:{" + queue + "}:"
	var n [4]*redis.IntCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		n[0], n[1] = p.LLen(ctx, base+"pending"), p.LLen(ctx, base+"active")
		n[2], n[3] = p.ZCard(ctx, base+"retry"), p.ZCard(ctx, base+"scheduled")
		return nil
	})
	must(err)
	s.peakTasks = max(s.peakTasks, int(n[0].Val()+n[1].Val()+n[2].Val()+n[3].Val()))
}

// scale runs a run of each size, then the first size again, on one worker,
// and prints their rates and memory. With fairness, it also times small
// runs alone before the largest run, and started while it is half done.
func scale(ctx context.Context, rdb *redis.Client, prefix, queue string, ns []int, showScale, fairness bool) {
	c := newClient(rdb, prefix, queue, *perTask)
	srv := newServer(rdb, queue)
	mux := asynq.NewServeMux()
	c.Register(mux)
	must(srv.Start(mux))
	defer srv.Shutdown()
	largest := slices.Max(ns)
	var alone []time.Duration
	if fairness {
		for range *smallRuns {
			alone = append(alone, runTime(run(ctx, rdb, c, queue, *small, nil)))
		}
	}
	order := slices.Clone(ns)
	if len(ns) > 1 {
		order = append(order, ns[0]) // the reference again: drift shows
	}
	if !showScale {
		order = []int{largest}
	}
	var rows []scaleRow
	var during *smallRunner
	for _, n := range order {
		var sr *smallRunner
		if fairness && n == largest {
			fairness = false // once
			during = &smallRunner{c: c, queue: queue}
			sr = during
		}
		rows = append(rows, measureRun(ctx, rdb, c, prefix, queue, n, sr))
	}
	if showScale {
		printScale(rows)
	}
	if during != nil && len(during.times) > 0 {
		a, d := benchutil.Median(alone), benchutil.Median(during.times)
		fmt.Printf("## Fairness: a %d-page run alone, and started while a %d-page run of the same job is half done\n\n", *small, largest)
		fmt.Println("| alone, median | during the large run, median | ratio (target ≤ 2) | alone, each | during, each |")
		fmt.Println("|---|---|---|---|---|")
		fmt.Printf("| %v | %v | **%.2f** | %s | %s |\n\n", a.Round(time.Millisecond), d.Round(time.Millisecond),
			float64(d)/float64(a), durs(alone), durs(during.times))
	}
}

// scaleRow is one run of the scale section.
type scaleRow struct {
	pages int
	st    *mapreduce.Status
	s     sample
	own   int64 // the run's own keys once it ended, before they expire
}

// measureRun runs a run of n pages, sampling Redis's memory and asynq's
// tasks every 50 ms, and, with small, small runs from half-way through.
func measureRun(ctx context.Context, rdb *redis.Client, c *mapreduce.Client, prefix, queue string, n int, small *smallRunner) scaleRow {
	idle := usedMemory(ctx, rdb)
	var s sample
	var last time.Time
	st := run(ctx, rdb, c, queue, n, func(st *mapreduce.Status) {
		if time.Since(last) >= 50*time.Millisecond {
			last = time.Now()
			s.take(ctx, rdb, queue, idle)
		}
		if small != nil {
			small.step(ctx, st, n)
		}
	})
	if small != nil {
		small.check(n)
	}
	return scaleRow{n, st, s, benchutil.RunBytes(ctx, rdb, prefix, "noop", st.ID)}
}

// smallRunner runs -small-runs small runs one after another from half-way
// through a large run, and times each from its start to its end.
type smallRunner struct {
	c     *mapreduce.Client
	queue string
	id    string // the small run under way, if any
	err   error  // the first small run that did not succeed
	times []time.Duration
}

// step, given each status st of the large run of n pages, starts the next
// small run once the last has ended.
func (sr *smallRunner) step(ctx context.Context, st *mapreduce.Status, n int) {
	if len(sr.times) >= *smallRuns || st.Done < n/2 {
		return
	}
	if sr.id != "" {
		sst, err := sr.c.Status(ctx, sr.id)
		must(err)
		if !sst.State.Ended() {
			return
		}
		if sst.State != mapreduce.StateSucceeded {
			sr.err = fmt.Errorf("small run %s ended %s: %s", sr.id, sst.State, sst.Error)
		}
		sr.times = append(sr.times, runTime(sst))
		sr.id = ""
		if len(sr.times) >= *smallRuns {
			return
		}
	}
	id, err := noopJob(sr.queue, 0).Start(ctx, sr.c, *small, mapreduce.StartOptions{})
	must(err)
	sr.id = id
}

// check exits if a small run failed, or if the large run of n pages ended
// before every small run had run.
func (sr *smallRunner) check(n int) {
	must(sr.err)
	if len(sr.times) < *smallRuns {
		must(fmt.Errorf("the %d-page run ended before %d small runs could run during it: use more pages", n, *smallRuns))
	}
}

// printScale prints the scale section's table.
func printScale(rows []scaleRow) {
	w := *window
	if w == 0 {
		w = 10_000
	}
	fmt.Printf("## Runs of growing size, no-op Map, window %d pages, one worker\n\n", w)
	fmt.Println("| pages | run time | end-to-end pages/s | vs the first size, mean of its runs before and after (target ≥ 0.9) | Redis memory at the live run's peak, above idle | most tasks asynq held (window + split) | the run's own keys, finished |")
	fmt.Println("|---|---|---|---|---|---|---|")
	// The first size runs first and last: the machine's drift over the
	// benchmark shows in the difference, and their mean is the reference.
	ref := (rate(rows[0].st) + rate(rows[len(rows)-1].st)) / 2
	for _, r := range rows {
		fmt.Printf("| %d | %v | %.0f | **%.2f** | %.1f MiB (%.0f B/page; %d samples) | %d | %.1f MiB (%.1f B/page) |\n",
			r.pages, runTime(r.st).Round(time.Millisecond), rate(r.st), rate(r.st)/ref,
			float64(r.s.peakMem)/(1<<20), float64(r.s.peakMem)/float64(r.pages), r.s.samples, r.s.peakTasks,
			float64(r.own)/(1<<20), float64(r.own)/float64(r.pages))
	}
	fmt.Println()
}

// runTime is a run's time from its creation to its end, by Redis's clock.
func runTime(st *mapreduce.Status) time.Duration { return st.Finished.Sub(st.Created) }

func rate(st *mapreduce.Status) float64 { return float64(st.Total) / runTime(st).Seconds() }

func mapreduceRound(ctx context.Context, rdb *redis.Client, prefix, queue string, n, pagesPerTask int) time.Duration {
	c := newClient(rdb, prefix, queue, pagesPerTask)
	srv := newServer(rdb, queue)
	mux := asynq.NewServeMux()
	c.Register(mux)
	must(srv.Start(mux))
	defer srv.Shutdown()
	start := time.Now()
	run(ctx, rdb, c, queue, n, nil)
	return time.Since(start)
}

// bareRound enqueues n no-op tasks, 16 at a time like a split, into a
// queue a server with the same concurrency drains, and times the lot.
func bareRound(ctx context.Context, rdb *redis.Client, queue string) time.Duration {
	n := *tasks
	var processed atomic.Int64
	done := make(chan struct{})
	srv := newServer(rdb, queue)
	must(srv.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if processed.Add(1) == int64(n) {
			close(done)
		}
		return nil
	})))
	defer srv.Shutdown()
	aq := asynq.NewClientFromRedisClient(rdb)
	defer aq.Close()
	start := time.Now()
	work := make(chan int, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, err := aq.EnqueueContext(ctx, asynq.NewTask("noop", []byte(`{"i":`+strconv.Itoa(i)+`}`)),
					asynq.Queue(queue), asynq.TaskID(queue+":"+strconv.Itoa(i)), asynq.MaxRetry(0))
				must(err)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	<-done
	return time.Since(start)
}

func usedMemory(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	must(err)
	n, _ := strconv.ParseInt(benchutil.InfoField(info, "used_memory"), 10, 64)
	return n
}

func cleanup(rdb *redis.Client, base string, queues []string) {
	patterns := []string{base + "*"}
	for _, q := range queues {
		patterns = append(patterns, "asynq:{"+q+"}:*")
		rdb.SRem(context.Background(), "asynq:queues", q)
	}
	benchutil.DeleteMatching(rdb, patterns...)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func durs(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return strings.Join(parts, " ")
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mrbench:", err)
		os.Exit(1)
	}
}
