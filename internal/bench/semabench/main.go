// Command semabench measures the semaphore against a real Redis, side by
// side with a bare PING and with two polling designs, and prints Markdown
// tables for BENCHMARKS.md. Run it with `make bench`, which starts a
// throwaway Redis; or point -redis at a server of your own (it writes only
// keys under a fresh "semabench:<random>" prefix and removes them).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

var (
	redisURL   = flag.String("redis", os.Getenv("BATCHMR_TEST_REDIS_URL"), "Redis URL (default $BATCHMR_TEST_REDIS_URL)")
	rounds     = flag.Int("rounds", 5, "rounds of the round-trip comparison")
	perRound   = flag.Int("n", 2000, "operations per round")
	handoffs   = flag.Int("handoffs", 1000, "hand-off samples")
	duration   = flag.Duration("duration", 3*time.Second, "length of each utilisation run")
	goroutines = flag.Int("goroutines", 32, "goroutines per process in the utilisation runs")
	processes  = flag.Int("processes", 2, "processes in the utilisation runs")
	limit      = flag.Int("limit", 4, "permits in the utilisation runs")
	holds      = flag.String("holds", "2ms,10ms", "work per grant in the utilisation runs, comma-separated: one table each")
	repeat     = flag.Int("repeat", 3, "interleaved runs per design in the utilisation runs; the median is reported")
	hold       = flag.Duration("hold", 0, "internal: work per grant of a utilisation worker")
	only       = flag.String("only", "", "run only these sections, comma-separated: roundtrip,handoff,commands,idle,utilisation,capacity,scripts,replica (replica: only when named; it starts redis-servers of its own)")
	designList = flag.String("designs", "", "utilisation designs to run, comma-separated (default all but the diagnostic token-dispatch ones)")

	// Set on the worker subprocesses of the utilisation runs.
	worker        = flag.String("worker", "", "internal: run as a utilisation worker for this design")
	prefix        = flag.String("prefix", "", "internal: key prefix")
	start         = flag.Int64("start", 0, "internal: start time, unix ns")
	cpuProfile    = flag.String("cpuprofile", "", "write each utilisation worker's CPU profile to this path + .<design>.<pid>")
	execTrace     = flag.String("trace", "", "write each utilisation worker's execution trace to this path + .<design>.<pid>; scripts/handoff-trace.py reads it")
	capLimit      = flag.Int("capacity-limit", 64, "permits in the capacity runs")
	capGoroutines = flag.Int("capacity-goroutines", 64, "goroutines per process in the capacity runs")
	capProcesses  = flag.Int("capacity-processes", 4, "processes in the capacity runs")
	capDuration   = flag.Duration("capacity-duration", 3*time.Second, "length of each capacity run")
	capDesigns    = flag.String("capacity-designs", "batchmr,token-list,bound-1rtt", "designs in the capacity runs, comma-separated; batchmr-before is added with -before-exe")
	beforeExe     = flag.String("before-exe", "", "a semabench binary built from another commit: its batchmr workers run as the design batchmr-before, side by side with this build's")

	jitter    = flag.Float64("hold-jitter", 0, "vary each grant's work uniformly by ± this fraction of the hold time (0.25: 2ms becomes 1.5–2.5ms)")
	holdClock = flag.String("hold-clock", "sleep", "how a utilisation worker waits out its work: sleep (time.Sleep: on an idle Go process it wakes on the next whole millisecond, so holds that end in the same millisecond end together) or nanosleep (a nanosleep system call on the goroutine's thread: it ends when it should, as a query ends when its reply arrives)")
)

func main() {
	flag.Parse()
	if *holdClock != "sleep" && *holdClock != "nanosleep" {
		fmt.Fprintf(os.Stderr, "semabench: -hold-clock %q: want sleep or nanosleep\n", *holdClock)
		os.Exit(2)
	}
	if *jitter < 0 || *jitter >= 1 {
		fmt.Fprintf(os.Stderr, "semabench: -hold-jitter %g: want a fraction in [0, 1), such as 0.25\n", *jitter)
		os.Exit(2)
	}
	rdb := benchutil.Redis("semabench", *redisURL, 0)
	defer rdb.Close()
	if *worker != "" {
		if *cpuProfile != "" {
			f, err := os.Create(fmt.Sprintf("%s.%s.%d", *cpuProfile, *worker, os.Getpid()))
			must(err)
			must(pprof.StartCPUProfile(f))
			defer pprof.StopCPUProfile()
		}
		if *execTrace != "" {
			f, err := os.Create(fmt.Sprintf("%s.%s.%d", *execTrace, *worker, os.Getpid()))
			must(err)
			must(trace.Start(f))
			defer trace.Stop()
		}
		if *worker == "scripts" { // -before-exe's side of the scripts section
			must(json.NewEncoder(os.Stdout).Encode(measureScripts(context.Background(), rdb, *prefix)))
			return
		}
		runWorker(rdb)
		return
	}
	ctx := context.Background()
	base := fmt.Sprintf("semabench:%08x", rand.Uint32())
	defer cleanup(rdb, base)
	info, _ := rdb.Info(ctx, "server").Result()
	fmt.Printf("# semabench: %s, Go %s, %d CPUs, Redis %s on %s\n\n", time.Now().Format("2006-01-02"),
		runtime.Version(), runtime.NumCPU(), benchutil.InfoField(info, "redis_version"), rdb.Options().Addr)

	sections := []struct {
		name string
		run  func(context.Context, *redis.Client, string)
	}{
		{"roundtrip", roundTrips}, {"handoff", handoff}, {"commands", commandCounts}, {"idle", idleRoundTrips}, {"utilisation", utilisation}, {"capacity", capacity},
		{"scripts", scriptCosts}, {"replica", replicaCost},
	}
	for _, sec := range sections {
		if *only == "" && sec.name == "replica" {
			continue // it starts servers of its own: only when asked for
		}
		if *only == "" || slices.Contains(strings.Split(*only, ","), sec.name) {
			sec.run(ctx, rdb, base+":"+sec.name)
		}
	}
}

func newSem(rdb *redis.Client, prefix string, limit int) *semaphore.Semaphore {
	s, err := semaphore.New(rdb, "db", semaphore.Options{Limit: limit, Prefix: prefix,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		panic(err)
	}
	return s
}

// roundTrips: uncontended Acquire+Release against a bare PING, interleaved
// in rounds so that both see the same machine. Reports the ratio of means
// (per round, median over rounds) and of per-operation medians.
func roundTrips(ctx context.Context, rdb *redis.Client, prefix string) {
	s := newSem(rdb, prefix, 1)
	defer s.Close()
	var ratios, pings, pairs []float64
	var pingOps, pairOps []time.Duration
	for r := 0; r < *rounds; r++ {
		t0 := time.Now()
		for i := 0; i < *perRound; i++ {
			t := time.Now()
			must(rdb.Ping(ctx).Err())
			pingOps = append(pingOps, time.Since(t))
		}
		ping := float64(time.Since(t0).Microseconds()) / float64(*perRound)
		t0 = time.Now()
		for i := 0; i < *perRound; i++ {
			t := time.Now()
			p, err := s.Acquire(ctx)
			must(err)
			must(p.Release(ctx))
			pairOps = append(pairOps, time.Since(t))
		}
		pair := float64(time.Since(t0).Microseconds()) / float64(*perRound)
		pings, pairs, ratios = append(pings, ping), append(pairs, pair), append(ratios, pair/ping)
	}
	slices.Sort(pingOps)
	slices.Sort(pairOps)
	p50 := func(d []time.Duration) float64 { return float64(d[len(d)/2].Nanoseconds()) / 1e3 }
	fmt.Printf("## 1. Uncontended Acquire+Release vs PING (%d rounds × %d, interleaved)\n\n", *rounds, *perRound)
	fmt.Println("| statistic | PING round trip | Acquire+Release | ratio (target ≤ 2.3) |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| mean per round, median of rounds | %.1f µs | %.1f µs | **%.2f** |\n", benchutil.Median(pings), benchutil.Median(pairs), benchutil.Median(ratios))
	fmt.Printf("| per-operation median | %.1f µs | %.1f µs | **%.2f** |\n\n", p50(pingOps), p50(pairOps), p50(pairOps)/p50(pingOps))
}

// handoff: from the call of Release to the return of the waiter's Acquire,
// the waiter being another handle (as another process would be).
func handoff(ctx context.Context, rdb *redis.Client, prefix string) {
	a := newSem(rdb, prefix, 1)
	defer a.Close()
	brdb := redis.NewClient(rdb.Options())
	defer brdb.Close()
	b := newSem(brdb, prefix, 1)
	defer b.Close()
	lat := make([]time.Duration, 0, *handoffs)
	for i := 0; i < *handoffs; i++ {
		p, err := a.Acquire(ctx)
		must(err)
		got := make(chan time.Time, 1)
		go func() {
			q, err := b.Acquire(ctx)
			must(err)
			got <- time.Now()
			must(q.Release(ctx))
		}()
		for { // wait, outside the measurement, until b is queued
			st, err := a.Stats(ctx)
			must(err)
			if len(st.Waiters) == 1 {
				break
			}
		}
		t0 := time.Now()
		must(p.Release(ctx))
		lat = append(lat, (<-got).Sub(t0))
	}
	slices.Sort(lat)
	q := func(f float64) string { return fmtDur(lat[int(f*float64(len(lat)-1))]) }
	fmt.Printf("## 2. Hand-off latency: Release called → waiter's Acquire returns (%d samples)\n\n", len(lat))
	fmt.Println("| p50 | p90 | p99 (target ≤ 2 ms) | max |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| %s | %s | **%s** | %s |\n\n", q(0.5), q(0.9), q(0.99), fmtDur(lat[len(lat)-1]))
}

// idleRoundTrips: a bare PING's round trip after the client slept. On
// machines whose idle CPUs wake slowly (VMs especially), a round trip from
// idle costs several times one from busy; every hand-off pays one.
func idleRoundTrips(ctx context.Context, rdb *redis.Client, _ string) {
	fmt.Println("## 5. PING round trip after the client was idle (300 samples each)")
	fmt.Println()
	fmt.Println("| idle before the PING | p50 | p90 |")
	fmt.Println("|---|---|---|")
	for _, idle := range []time.Duration{0, 500 * time.Microsecond, 2 * time.Millisecond, 10 * time.Millisecond} {
		var d []time.Duration
		for i := 0; i < 300; i++ {
			time.Sleep(idle)
			t := time.Now()
			must(rdb.Ping(ctx).Err())
			d = append(d, time.Since(t))
		}
		slices.Sort(d)
		fmt.Printf("| %v | %v | %v |\n", idle, d[len(d)/2].Round(time.Microsecond), d[len(d)*9/10].Round(time.Microsecond))
	}
	fmt.Println()
}

// commandCounts: Redis commands per Acquire+Release from INFO commandstats,
// which counts the commands scripts run as well as the ones clients send.
func commandCounts(ctx context.Context, rdb *redis.Client, prefix string) {
	s := newSem(rdb, prefix, 1)
	defer s.Close()
	p, err := s.Acquire(ctx) // load the scripts before counting
	must(err)
	must(p.Release(ctx))
	const n = 1000
	before := commandStats(ctx, rdb)
	for i := 0; i < n; i++ {
		p, err := s.Acquire(ctx)
		must(err)
		must(p.Release(ctx))
	}
	after := commandStats(ctx, rdb)
	after["info"]-- // our own INFO call
	var names []string
	total := 0.0
	sent := 0.0
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			names = append(names, k)
			total += float64(d)
			if k == "evalsha" || k == "eval" || k == "fcall" {
				sent += float64(d)
			}
		}
	}
	slices.Sort(names)
	fmt.Printf("## 4. Redis commands per uncontended Acquire+Release (INFO commandstats, %d pairs)\n\n", n)
	fmt.Println("| sent by the client | run by Redis in all | by command |")
	fmt.Println("|---|---|---|")
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(after[k]-before[k])/n))
	}
	fmt.Printf("| %.1f | %.1f | %s |\n\n", sent/n, (total-sent)/n+sent/n, strings.Join(parts, ", "))
}

func commandStats(ctx context.Context, rdb *redis.Client) map[string]int64 {
	out := map[string]int64{}
	for k, u := range commandUsage(ctx, rdb) {
		out[k] = u.Calls
	}
	return out
}

// usage is one command's line of INFO commandstats.
type usage = benchutil.CommandStat

func commandUsage(ctx context.Context, rdb *redis.Client) map[string]usage {
	u, err := benchutil.CommandStats(ctx, rdb)
	must(err)
	return u
}

type workerResult struct {
	BusyNs   int64 `json:"busy_ns"`
	Grants   int64 `json:"grants"`
	Commands int64 `json:"commands"` // commands this process sent to Redis

	WaitsMicros []int64 `json:"waits_us"` // how long each grant waited in acquire
}

// redisCPU is the CPU time the Redis server has used so far.
func redisCPU(ctx context.Context, rdb *redis.Client) time.Duration {
	return benchutil.RedisCPU(ctx, rdb)
}

// counter counts the commands a client sends (pipelines count each command).
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// capacity: how many grants per second one Redis gives at saturation —
// holds of 0, many waiters over several processes — and the Redis CPU each
// grant costs, side by side with the token list and the PING bound.
// Designs run interleaved, -repeat times; the median run is reported.
func capacity(ctx context.Context, rdb *redis.Client, prefix string) {
	l := load{limit: *capLimit, goroutines: *capGoroutines, processes: *capProcesses, duration: *capDuration}
	chosen := capacityDesigns(l)
	runs := runInterleaved(ctx, rdb, prefix, chosen, l)
	medians := make([]runResult, len(chosen))
	for i := range chosen {
		medians[i] = medianRun(runs[i], func(r runResult) float64 { return r.grantsPerSec })
	}
	printCapacity(chosen, runs, medians, l)
	printPerGrant(chosen, medians, l)
}

// capacityDesigns are the designs -capacity-designs names, batchmr-before
// second with -before-exe; it exits on an unknown one, or a bound whose
// limit does not split over the processes of l.
func capacityDesigns(l load) []design {
	names := strings.Split(*capDesigns, ",")
	if *beforeExe != "" && !slices.Contains(names, "batchmr-before") {
		names = slices.Insert(names, 1, "batchmr-before")
	}
	var chosen []design
	for _, n := range names {
		i := slices.IndexFunc(designs, func(d design) bool { return d.name == n })
		if i < 0 {
			fmt.Fprintf(os.Stderr, "semabench: -capacity-designs: unknown design %q\n", n)
			os.Exit(2)
		}
		if strings.HasPrefix(n, "bound-") && l.limit%l.processes != 0 {
			fmt.Fprintf(os.Stderr, "semabench: %s splits -capacity-limit (%d) over -capacity-processes (%d): make it a multiple\n", n, l.limit, l.processes)
			os.Exit(2)
		}
		chosen = append(chosen, designs[i])
	}
	return chosen
}

// printCapacity prints the capacity table: each design's median run
// (medians[i] of runs[i]), against the token list's and the PING bound's.
func printCapacity(chosen []design, runs [][]runResult, medians []runResult, l load) {
	ref := map[string]runResult{}
	for i, d := range chosen {
		ref[d.name] = medians[i]
	}
	ratio := func(a, b float64) string {
		if b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", a/b)
	}
	fmt.Printf("## 6. Capacity at saturation: holds of 0, limit %d, %d goroutines in %d processes (median of %d interleaved runs of %v)\n\n",
		l.limit, l.goroutines*l.processes, l.processes, *repeat, l.duration)
	fmt.Println("| design | grants/s | runs | vs token list | vs PING bound | Redis CPU µs/grant | vs token list | Redis CPU busy | Redis commands/grant | wait p50 / p99 / max |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	tl, pb := ref["token-list"], ref["bound-1rtt"]
	for i, d := range chosen {
		m := medians[i]
		var each []string
		for _, r := range runs[i] {
			each = append(each, fmt.Sprintf("%.0f", r.grantsPerSec))
		}
		var cmds int64
		for _, u := range m.redisCmds {
			cmds += u.Calls
		}
		fmt.Printf("| %s | **%.0f** | %s | %s | %s | **%.1f** | %s | %.0f%% | %.1f | %s |\n", d.about, m.grantsPerSec, strings.Join(each, " "),
			ratio(m.grantsPerSec, tl.grantsPerSec), ratio(m.grantsPerSec, pb.grantsPerSec),
			m.redisCPU, ratio(m.redisCPU, tl.redisCPU), 100*m.redisBusy,
			float64(cmds)/(m.grantsPerSec*l.duration.Seconds()), waitQuantiles(runs[i]))
	}
	fmt.Println()
}

// printPerGrant prints where batchmr's Redis time goes: INFO commandstats
// of the median run, per grant. A script's µs include those of the
// commands it ran.
func printPerGrant(chosen []design, medians []runResult, l load) {
	for i, d := range chosen {
		if !strings.HasPrefix(d.name, "batchmr") {
			continue
		}
		m := medians[i]
		grants := m.grantsPerSec * l.duration.Seconds()
		names := slices.Sorted(maps.Keys(m.redisCmds))
		slices.SortStableFunc(names, func(a, b string) int { return -cmpFloat(float64(m.redisCmds[a].Usec), float64(m.redisCmds[b].Usec)) })
		var parts []string
		for _, k := range names {
			u := m.redisCmds[k]
			parts = append(parts, fmt.Sprintf("%s %.2f× %.1f µs", k, float64(u.Calls)/grants, float64(u.Usec)/grants))
		}
		fmt.Printf("Per grant, %s (INFO commandstats, calls and µs; a script's µs include its commands'): %s\n\n", d.name, strings.Join(parts, ", "))
	}
}

type design struct {
	name, about string
	// diagnostic designs run only when -designs names them: they take one
	// part of a design apart (see BENCHMARKS.md, "Designs").
	diagnostic bool
}

var designs = []design{
	{name: "batchmr", about: "batchmr semaphore: FIFO queue, hand-off on release"},
	{name: "batchmr-before", about: "batchmr semaphore as built by -before-exe"},
	{name: "batchmr-eval", about: "batchmr semaphore, scripts by EVALSHA (as on Redis < 7)"},
	{name: "zset-poll-10ms", about: "asynq x/rate style: ZREMRANGEBYSCORE+ZCARD+ZADD, retry after 10 ms"},
	{name: "zset-poll-1ms", about: "asynq x/rate style, retry after 1 ms"},
	{name: "lock-counter", about: "SET NX lock + counter, backoff 1→32 ms with jitter"},
	{name: "token-list", about: "redis-semaphore gem style: BLPOP a token list, RPUSH it back (fair, but no leases)"},
	{name: "token-dispatch", about: "not a design: the token list behind one BLPOP per process, routed to local waiters (batchmr's wake path)", diagnostic: true},
	{name: "token-dispatch-lua", about: "not a design: token-dispatch, released by a one-command Lua script", diagnostic: true},
	{name: "token-dispatch-lua24", about: "not a design: token-dispatch, released by a Lua script of 25 commands", diagnostic: true},
	{name: "token-dispatch-ticket", about: "not a design: token-dispatch, each acquire first taking a FIFO ticket by a script as batchmr's queued acquire does", diagnostic: true},
	{name: "ticket-wake", about: "not a design: a ticket semaphore whose release script (4 commands) pushes the next ticket to its process's wake list, batchmr's wake path (fleet-wide FIFO; no leases)", diagnostic: true},
	{name: "bound-1rtt", about: "bound, not a design: limit split over the processes, in-process hand-off after one PING"},
	{name: "bound-local", about: "bound, not a design: limit split over the processes, in-process hand-off"},
}

// utilisation runs each design with -processes worker processes of
// -goroutines goroutines for -duration, every grant holding the permit for
// the hold time, and reports busy permit-time / (limit × wall time). Designs
// run interleaved, -repeat times, and the median run is reported, so that
// all designs see the same machine.
func utilisation(ctx context.Context, rdb *redis.Client, prefix string) {
	for _, h := range strings.Split(*holds, ",") {
		hold, err := time.ParseDuration(h)
		must(err)
		utilisationFor(ctx, rdb, prefix+":"+h, hold)
	}
}

type runResult struct {
	util, grantsPerSec, cmdsPerSec, workerCPU, redisCPU float64
	redisBusy                                           float64          // Redis CPU time / wall time
	redisCmds                                           map[string]usage // per command, over the run
	waits                                               []time.Duration
}

// load is the shape of one contended run: how many worker processes of how
// many goroutines share how many permits, each grant held for hold.
type load struct {
	limit, goroutines, processes int
	duration, hold               time.Duration
}

// flagLoad is the utilisation section's load, from the flags.
func flagLoad(hold time.Duration) load {
	return load{limit: *limit, goroutines: *goroutines, processes: *processes, duration: *duration, hold: hold}
}

// utilisationFor runs the utilisation section for hold of work per grant
// and prints its table and how batchmr met its targets.
func utilisationFor(ctx context.Context, rdb *redis.Client, prefix string, hold time.Duration) {
	chosen := utilisationDesigns()
	runs := runInterleaved(ctx, rdb, prefix, chosen, flagLoad(hold))
	med := printUtilisation(chosen, runs, hold)
	printTargets(chosen, runs, med)
}

// utilisationDesigns are the designs -designs names (default: all but
// the diagnostic ones), batchmr-before only with -before-exe; it exits on
// a bound whose -limit does not split over -processes.
func utilisationDesigns() []design {
	var chosen []design
	for _, d := range designs {
		if d.name == "batchmr-before" && *beforeExe == "" {
			continue
		}
		if (*designList == "" && !d.diagnostic) || slices.Contains(strings.Split(*designList, ","), d.name) {
			chosen = append(chosen, d)
			if strings.HasPrefix(d.name, "bound-") && *limit%*processes != 0 {
				fmt.Fprintf(os.Stderr, "semabench: %s splits -limit over the processes: make -limit (%d) a multiple of -processes (%d), or leave it out with -designs\n", d.name, *limit, *processes)
				os.Exit(2)
			}
		}
	}
	return chosen
}

// printUtilisation prints the utilisation table of runs[i], chosen[i]'s
// runs with hold of work per grant, and returns each design's median
// utilisation.
func printUtilisation(chosen []design, runs [][]runResult, hold time.Duration) map[string]float64 {
	work := hold.String()
	if *jitter > 0 {
		work = fmt.Sprintf("%v ± %.0f%%", hold, 100**jitter)
	}
	fmt.Printf("## 3. Permit utilisation under contention: limit %d, %d goroutines in %d processes, %s of work per grant (median of %d interleaved runs of %v)\n\n",
		*limit, *goroutines**processes, *processes, work, *repeat, *duration)
	fmt.Println("| design | utilisation | vs one-PING bound | runs (in round order) | wait p50 / p99 / max | grants/s | client commands/s | worker CPU µs/grant | Redis CPU µs/grant |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	byUtil := func(r runResult) float64 { return r.util }
	med := map[string]float64{}
	for i, d := range chosen {
		med[d.name] = medianRun(runs[i], byUtil).util
	}
	for i, d := range chosen {
		utils := make([]string, len(runs[i]))
		for j, r := range runs[i] {
			utils[j] = fmt.Sprintf("%.3f", r.util)
		}
		m := medianRun(runs[i], byUtil)
		vsBound := "–"
		if b := med["bound-1rtt"]; b > 0 {
			vsBound = fmt.Sprintf("%.3f", m.util/b)
		}
		fmt.Printf("| %s | **%.3f** | %s | %s | %s | %.0f | %.0f | %.0f | %.0f |\n", d.about, m.util, vsBound,
			strings.Join(utils, " "), waitQuantiles(runs[i]),
			m.grantsPerSec, m.cmdsPerSec, m.workerCPU, m.redisCPU)
	}
	fmt.Println()
	return med
}

// printTargets prints whether batchmr met its utilisation targets in runs,
// against the medians med of every design.
func printTargets(chosen []design, runs [][]runResult, med map[string]float64) {
	// The utilisation targets, against what the machine allows in the same
	// run: batchmr / one-PING bound ≥ 0.95 (per round, so that both saw the
	// same moment), and batchmr ≥ 0.95 absolute and no less than any polling
	// design.
	ours, ok := med["batchmr"]
	if !ok {
		return
	}
	verdict := func(met bool) string {
		if met {
			return "met"
		}
		return "not met"
	}
	oi := slices.IndexFunc(chosen, func(d design) bool { return d.name == "batchmr" })
	// perRound returns batchmr's utilisation over design name's, round by round,
	// their median, and the rounds as text; ok is false if name did not run.
	perRound := func(name string) (ratios []float64, m float64, each string, ok bool) {
		i := slices.IndexFunc(chosen, func(d design) bool { return d.name == name })
		if i < 0 {
			return nil, 0, "", false
		}
		var parts []string
		for r := range runs[oi] {
			x := runs[oi][r].util / runs[i][r].util
			ratios = append(ratios, x)
			parts = append(parts, fmt.Sprintf("%.3f", x))
		}
		return ratios, benchutil.Median(ratios), strings.Join(parts, " "), true
	}
	if ratios, m, each, ok := perRound("bound-1rtt"); ok {
		fmt.Printf("- batchmr / one-PING bound, per round: median **%.3f** (rounds: %s; min %.3f, max %.3f); target ≥ 0.95: **%s**\n",
			m, each, slices.Min(ratios), slices.Max(ratios), verdict(m >= 0.95))
	}
	if ratios, m, each, ok := perRound("ticket-wake"); ok {
		// Not a target: what S1 and S3–S5 cost beyond strict FIFO itself.
		fmt.Printf("- batchmr / ticket-wake (strict FIFO and nothing else), per round: median **%.3f** (rounds: %s; min %.3f, max %.3f)\n",
			m, each, slices.Min(ratios), slices.Max(ratios))
	}
	fmt.Printf("- batchmr absolute: **%.3f** (min %.3f over the rounds); target ≥ 0.95: **%s**\n", ours,
		slices.MinFunc(runs[oi], func(a, b runResult) int { return cmpFloat(a.util, b.util) }).util, verdict(ours >= 0.95))
	var polls []string
	best := 0.0
	for _, d := range chosen {
		if strings.HasPrefix(d.name, "zset-poll") || d.name == "lock-counter" {
			polls = append(polls, fmt.Sprintf("%s %.3f", d.name, med[d.name]))
			best = max(best, med[d.name])
		}
	}
	if len(polls) > 0 {
		fmt.Printf("- batchmr vs the polling designs (medians): batchmr %.3f, %s; no less than any: **%s**\n", ours, strings.Join(polls, ", "), verdict(ours >= best))
	}
	fmt.Println()
}

// runInterleaved runs each design of chosen under load l, -repeat times,
// the designs interleaved within each round, so that all see the same
// machine; runs[i] are chosen[i]'s, in round order.
func runInterleaved(ctx context.Context, rdb *redis.Client, prefix string, chosen []design, l load) [][]runResult {
	exe, err := os.Executable()
	must(err)
	runs := make([][]runResult, len(chosen))
	for r := 0; r < *repeat; r++ {
		for i, d := range chosen {
			runs[i] = append(runs[i], utilisationRun(ctx, rdb, exe, fmt.Sprintf("%s:%s:%d", prefix, d.name, r), d.name, l))
		}
	}
	return runs
}

// medianRun is the median of rs by key (the upper one of an even count).
func medianRun(rs []runResult, key func(runResult) float64) runResult {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b runResult) int { return cmpFloat(key(a), key(b)) })
	return rs[len(rs)/2]
}

// waitQuantiles is "p50 / p99 / max" of the waits of every run of rs.
func waitQuantiles(rs []runResult) string {
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.waits...)
	}
	slices.Sort(all)
	q := func(f float64) time.Duration { return all[int(f*float64(len(all)-1))] }
	return fmt.Sprintf("%s / %s / %s", fmtDur(q(0.5)), fmtDur(q(0.99)), fmtDur(all[len(all)-1]))
}

// utilisationRun runs one design under load l in fresh worker processes and
// measures it, Redis's CPU time and commands (those scripts run included)
// over the whole run.
func utilisationRun(ctx context.Context, rdb *redis.Client, exe, prefix, name string, l load) runResult {
	startAt := time.Now().Add(500 * time.Millisecond)
	if d, ok := strings.CutPrefix(name, "batchmr-before"); ok && *beforeExe != "" {
		exe, name = *beforeExe, "batchmr"+d
	}
	cpuBefore := redisCPU(ctx, rdb)
	cmdsBefore := commandUsage(ctx, rdb)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var total workerResult
	var cpu time.Duration
	for i := 0; i < l.processes; i++ {
		cmd := exec.Command(exe, "-worker", name, "-cpuprofile", *cpuProfile, "-trace", *execTrace, "-hold-jitter", strconv.FormatFloat(*jitter, 'g', -1, 64), "-prefix", prefix, "-redis", *redisURL,
			"-start", strconv.FormatInt(startAt.UnixNano(), 10), "-duration", l.duration.String(),
			"-goroutines", strconv.Itoa(l.goroutines), "-processes", strconv.Itoa(l.processes), "-limit", strconv.Itoa(l.limit), "-hold", l.hold.String())
		if *holdClock != "sleep" { // only then: a -before-exe from before the flag does not know it
			cmd.Args = append(cmd.Args, "-hold-clock", *holdClock)
		}
		cmd.Stderr = os.Stderr
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := cmd.Output()
			must(err)
			var r workerResult
			must(json.Unmarshal(out, &r))
			mu.Lock()
			defer mu.Unlock()
			total.BusyNs += r.BusyNs
			total.Grants += r.Grants
			total.Commands += r.Commands
			total.WaitsMicros = append(total.WaitsMicros, r.WaitsMicros...)
			cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}()
	}
	wg.Wait()
	redisUsed := redisCPU(ctx, rdb) - cpuBefore
	cmdsAfter := commandUsage(ctx, rdb)
	g := float64(total.Grants)
	res := runResult{
		util:         float64(total.BusyNs) / (float64(l.limit) * float64(l.duration.Nanoseconds())),
		grantsPerSec: g / l.duration.Seconds(),
		cmdsPerSec:   float64(total.Commands) / l.duration.Seconds(),
		workerCPU:    float64(cpu.Microseconds()) / g,
		redisCPU:     float64(redisUsed.Microseconds()) / g,
		redisBusy:    redisUsed.Seconds() / l.duration.Seconds(),
		redisCmds:    map[string]usage{},
	}
	for k, v := range cmdsAfter {
		if k == "info" {
			continue // ours
		}
		if d := (usage{Calls: v.Calls - cmdsBefore[k].Calls, Usec: v.Usec - cmdsBefore[k].Usec}); d.Calls > 0 {
			res.redisCmds[k] = d
		}
	}
	for _, w := range total.WaitsMicros {
		res.waits = append(res.waits, time.Duration(w)*time.Microsecond)
	}
	return res
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// runWorker is one process of a utilisation run.
func runWorker(rdb *redis.Client) {
	ctx := context.Background()
	if *holdClock == "nanosleep" {
		// A goroutine in a system call keeps its P until sysmon takes it
		// back, which an idle process's sysmon does only every few ms:
		// with a P for every holder, the other goroutines never wait for
		// one.
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + *limit)
	}
	sent := &counter{}
	rdb.AddHook(sent)
	acquire, done := designAcquire(ctx, rdb, sent)
	defer done()
	res := contend(ctx, acquire)
	res.Commands = sent.n.Load()
	must(json.NewEncoder(os.Stdout).Encode(res))
}

// designAcquire returns the acquire of the design -worker names, on rdb
// (or clients of its own, which count their commands in sent), and what
// closes what it opened.
func designAcquire(ctx context.Context, rdb *redis.Client, sent *counter) (acquire func(context.Context) (func(), error), done func()) {
	done = func() {}
	switch *worker {
	case "batchmr", "batchmr-eval":
		if *worker == "batchmr-eval" {
			if evalOnly := evalOnlyClient(ctx, rdb); evalOnly != rdb {
				rdb = evalOnly
				rdb.AddHook(sent)
			}
		}
		s := newSem(rdb, *prefix, *limit)
		done = func() { s.Close() }
		acquire = func(ctx context.Context) (func(), error) {
			p, err := s.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return func() { must(p.Release(context.Background())) }, nil
		}
	case "zset-poll-10ms", "zset-poll-1ms":
		sleep := 10 * time.Millisecond
		if *worker == "zset-poll-1ms" {
			sleep = time.Millisecond
		}
		z := &pollingZSet{rdb: rdb, key: *prefix + ":zset", limit: *limit, sleep: sleep, lease: 30 * time.Second}
		acquire = z.acquire
	case "token-list":
		// One blocking connection per goroutine, as the design needs.
		opt := *rdb.Options()
		opt.PoolSize = *goroutines + 2
		trdb := redis.NewClient(&opt)
		trdb.AddHook(sent)
		done = func() { trdb.Close() }
		acquire = newTokenList(ctx, trdb, *prefix+":tokens", *limit).acquire
	case "token-dispatch", "token-dispatch-lua", "token-dispatch-lua24", "token-dispatch-ticket":
		d := newTokenDispatch(ctx, rdb, *prefix+":tokens", *limit)
		switch *worker {
		case "token-dispatch-lua":
			d.script = pushScript
		case "token-dispatch-lua24":
			d.script = pushScript24
		case "token-dispatch-ticket":
			d.ticket, d.id = ticketScript, strconv.Itoa(os.Getpid())
		}
		acquire = d.acquire
	case "ticket-wake":
		acquire = newTicketWake(ctx, rdb, *prefix+":tw", *limit).acquire
	case "bound-1rtt", "bound-local": // -limit is a multiple of -processes: see utilisationFor
		acquire = newLocalBound(rdb, *limit / *processes, *worker == "bound-1rtt").acquire
	case "lock-counter":
		l := &lockCounter{rdb: rdb, lock: *prefix + ":lock", counter: *prefix + ":count", limit: *limit, min: time.Millisecond, max: 32 * time.Millisecond}
		acquire = l.acquire
	default:
		fmt.Fprintf(os.Stderr, "semabench: unknown design %q\n", *worker)
		os.Exit(2)
	}
	return acquire, done
}

// contend runs -goroutines goroutines that acquire, hold for -hold and
// release from -start for -duration, and returns the permit-time they
// held inside that window, their grants and how long each waited.
func contend(ctx context.Context, acquire func(context.Context) (func(), error)) workerResult {
	begin := time.Unix(0, *start)
	end := begin.Add(*duration)
	time.Sleep(time.Until(begin))
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var busy, grants atomic.Int64
	var wg sync.WaitGroup
	var waitsMu sync.Mutex
	var waits []int64
	for g := 0; g < *goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				asked := time.Now()
				release, err := acquire(runCtx)
				if err != nil {
					return // the run's deadline
				}
				// The two marks scripts/handoff-trace.py pairs up.
				trace.Log(ctx, "handoff", "granted")
				t0 := time.Now()
				waitsMu.Lock()
				waits = append(waits, t0.Sub(asked).Microseconds())
				waitsMu.Unlock()
				work := *hold
				if *jitter > 0 {
					work = time.Duration(float64(work) * (1 + *jitter*(2*rand.Float64()-1)))
				}
				holdFor(work)
				t1 := time.Now()
				trace.Log(ctx, "handoff", "release")
				release()
				// Count only permit-time inside the measured window.
				if t1.After(end) {
					t1 = end
				}
				if t1.After(t0) {
					busy.Add(int64(t1.Sub(t0)))
					grants.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return workerResult{BusyNs: busy.Load(), Grants: grants.Load(), WaitsMicros: waits}
}

// holdFor waits out a grant's work as -hold-clock says.
func holdFor(d time.Duration) {
	if *holdClock == "sleep" {
		time.Sleep(d)
		return
	}
	// The thread sleeps in the kernel; the runtime hands its P to another
	// thread meanwhile. EINTR (a signal, the runtime's preemption among
	// them) leaves the rest in rem.
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		if err := syscall.Nanosleep(&ts, &rem); err != syscall.EINTR {
			return
		}
		ts = rem
	}
}

// evalOnlyClient returns a client of a user whose ACL denies FCALL, so that
// the semaphore runs its scripts with EVALSHA, as it does on Redis < 7.
// The user exists only for the run: cleanup deletes it.
func evalOnlyClient(ctx context.Context, rdb *redis.Client) *redis.Client {
	if err := rdb.Do(ctx, "ACL", "SETUSER", evalOnlyUser(*prefix), "on", ">semabench", "~*", "&*", "+@all", "-fcall").Err(); err != nil {
		// Redis < 7 has no FCALL: every client runs EVALSHA already.
		fmt.Fprintln(os.Stderr, "semabench: batchmr-eval runs as the default user:", err)
		return rdb
	}
	opt := *rdb.Options()
	opt.Username, opt.Password = evalOnlyUser(*prefix), "semabench"
	return redis.NewClient(&opt)
}

// evalOnlyUser names the EVALSHA-only user of the run whose keys start
// with prefix: its first segment is the run's own "semabench:<random>".
func evalOnlyUser(prefix string) string {
	parts := strings.SplitN(prefix, ":", 3)
	return strings.Join(parts[:min(2, len(parts))], "-") + "-evalonly"
}

func cleanup(rdb *redis.Client, base string) {
	ctx := context.Background()
	rdb.Do(ctx, "ACL", "DELUSER", evalOnlyUser(base))
	benchutil.DeleteMatching(rdb, base+"*")
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000)
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "semabench:", err)
		os.Exit(1)
	}
}
