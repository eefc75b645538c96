// Command clusterbench measures how batchmr's load spreads over a Redis
// Cluster's primaries, side by side with one standalone Redis, and what
// waiting for a replica costs a run; it prints Markdown tables for
// BENCHMARKS.md:
//
//   - spread: several jobs at once, each with its own queue and its own
//     semaphore, named so that their hash tags fall on different primaries,
//     with in-process workers; in interleaved rounds against the Cluster and
//     against the standalone Redis: pages/s, and for each primary its share
//     of Redis commands and CPU, commands and CPU µs per page, and memory
//     per page in flight;
//
//   - grants: one semaphore per primary at saturation (holds of 0): grants/s
//     and Redis CPU per grant on each primary, and on the standalone Redis;
//
//   - replica: one job's run against the Sentinel group's primary (it has a
//     replica: every ledger write waits for it) and against the standalone
//     Redis (no replica: no WAIT), interleaved: pages/s and the ratio.
//
//     go run ./internal/bench/clusterbench
//
// reads the servers from BATCHMR_TEST_REDIS_CLUSTER_ADDRS,
// BATCHMR_TEST_REDIS_URL and BATCHMR_TEST_REDIS_SENTINEL_URL (scripts/with-servers.sh
// sets them). It writes only under a fresh "clusterbench:<random>" prefix
// and its own asynq queues, and deletes them afterwards.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

var (
	clusterAddrs = flag.String("cluster", os.Getenv("BATCHMR_TEST_REDIS_CLUSTER_ADDRS"), "Redis Cluster node addresses, comma-separated (default $BATCHMR_TEST_REDIS_CLUSTER_ADDRS)")
	redisURL     = flag.String("redis", os.Getenv("BATCHMR_TEST_REDIS_URL"), "standalone Redis URL (default $BATCHMR_TEST_REDIS_URL)")
	sentinelURL  = flag.String("sentinel", os.Getenv("BATCHMR_TEST_REDIS_SENTINEL_URL"), "Sentinel URL of a primary with a replica, for the replica section (default $BATCHMR_TEST_REDIS_SENTINEL_URL)")
	only         = flag.String("only", "", "run only these sections, comma-separated: spread,grants,replica")
	jobs         = flag.Int("jobs", 6, "jobs run at once in the spread section, spread round-robin over the Cluster's primaries")
	pages        = flag.Int("pages", 5000, "pages of each job's run in the spread section")
	permits      = flag.Bool("permits", true, "in the spread section, each page's Map takes a permit of its job's semaphore (holds of 0), as a page that queries the database does")
	limit        = flag.Int("limit", 8, "permits of each job's semaphore in the spread section")
	concurrency  = flag.Int("concurrency", 8, "asynq concurrency of each job's worker (one asynq server per job)")
	rounds       = flag.Int("rounds", 3, "interleaved rounds of the spread and replica sections; medians are reported")
	grantLimit   = flag.Int("grant-limit", 16, "permits of each semaphore in the grants section")
	grantGo      = flag.Int("grant-goroutines", 16, "goroutines acquiring each handle in the grants section")
	grantHandles = flag.Int("grant-handles", 4, "handles on each semaphore in the grants section, as many worker processes would have: a grant to another handle goes through its wake list")
	grantDur     = flag.Duration("grant-duration", 3*time.Second, "length of each grants run")
	replicaPages = flag.Int("replica-pages", 20000, "pages of the replica section's run (no-op Map, no permits)")
	poll         = flag.Duration("poll-interval", 10*time.Millisecond, "asynq's TaskCheckInterval")
)

func main() {
	flag.Parse()
	ctx := context.Background()
	want := func(s string) bool { return *only == "" || slices.Contains(strings.Split(*only, ","), s) }
	base := fmt.Sprintf("clusterbench:%08x", rand.Uint32())

	std := standalone()
	defer cleanup(std, base)
	var cl *side
	if want("spread") || want("grants") {
		cl = cluster()
		defer cleanup(cl, base)
	}
	info, _ := std.primaries[0].rdb.Info(ctx, "server").Result()
	fmt.Printf("# clusterbench: %s, Go %s, %d CPUs, Redis %s\n\n", time.Now().Format("2006-01-02"),
		runtime.Version(), runtime.NumCPU(), benchutil.InfoField(info, "redis_version"))

	if want("spread") {
		spread(ctx, cl, std, base)
	}
	if want("grants") {
		grants(ctx, cl, std, base)
	}
	if want("replica") {
		sen := sentinel()
		defer cleanup(sen, base)
		replicaCost(ctx, sen, std, base)
	}
}

// side is one Redis deployment under test: the client batchmr uses, and a
// client on each primary and replica for INFO.
type side struct {
	name      string
	rdb       redis.UniversalClient
	primaries []node
	replicas  []node
}

type node struct {
	addr string
	rdb  *redis.Client
}

func cluster() *side {
	if *clusterAddrs == "" {
		fail(2, "no Redis Cluster: pass -cluster host:port,... or set BATCHMR_TEST_REDIS_CLUSTER_ADDRS (scripts/with-servers.sh does)")
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*clusterAddrs, ","), PoolSize: 256})
	ctx := context.Background()
	must(rdb.Ping(ctx).Err())
	s := &side{name: "Cluster", rdb: rdb}
	var mu sync.Mutex
	must(rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		s.primaries = append(s.primaries, node{c.Options().Addr, c})
		return nil
	}))
	must(rdb.ForEachSlave(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		s.replicas = append(s.replicas, node{c.Options().Addr, c})
		return nil
	}))
	slices.SortFunc(s.primaries, func(a, b node) int { return strings.Compare(a.addr, b.addr) })
	return s
}

func standalone() *side {
	rdb := benchutil.Redis("clusterbench", *redisURL, 256)
	return &side{name: "standalone", rdb: rdb, primaries: []node{{rdb.Options().Addr, rdb}}}
}

func sentinel() *side {
	if *sentinelURL == "" {
		fail(2, "no Sentinel group: pass -sentinel redis://SENTINEL/0?master_name=NAME&addr=... or set BATCHMR_TEST_REDIS_SENTINEL_URL (scripts/with-servers.sh does)")
	}
	opt, err := redis.ParseFailoverURL(*sentinelURL)
	if err != nil {
		fail(2, fmt.Sprintf("-sentinel %q: %v", *sentinelURL, err))
	}
	opt.PoolSize = 256
	rdb := redis.NewFailoverClient(opt)
	ctx := context.Background()
	must(rdb.Ping(ctx).Err())
	info, err := rdb.Info(ctx, "replication").Result()
	must(err)
	if n, _ := strconv.Atoi(benchutil.InfoField(info, "connected_slaves")); n < 1 {
		fail(1, "the Sentinel group's primary has no replica connected: the replica section needs one")
	}
	// A FailoverClient is a *redis.Client on the primary: INFO goes there.
	return &side{name: "primary with a replica", rdb: rdb, primaries: []node{{"primary", rdb}}}
}

// primaryOf returns the index in s.primaries of the primary that holds key.
func (s *side) primaryOf(ctx context.Context, key string) int {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return 0
	}
	c, err := cc.MasterForKey(ctx, key)
	must(err)
	return slices.IndexFunc(s.primaries, func(n node) bool { return n.addr == c.Options().Addr })
}

// tagOn returns the first name stem+"<i>" whose hash tag {name} the
// Cluster keeps on primary p.
func (s *side) tagOn(ctx context.Context, stem string, p int) string {
	for i := 0; i < 10000; i++ {
		name := stem + strconv.Itoa(i)
		if s.primaryOf(ctx, "{"+name+"}") == p {
			return name
		}
	}
	must(fmt.Errorf("no name %s<i> falls on primary %s", stem, s.primaries[p].addr))
	return ""
}

// counters is one reading of a node's INFO.
type counters struct {
	cpu  time.Duration
	cmds int64
	mem  int64
}

func read(ctx context.Context, rdb *redis.Client) counters {
	info, err := rdb.Info(ctx, "cpu", "stats", "memory").Result()
	must(err)
	user, _ := strconv.ParseFloat(benchutil.InfoField(info, "used_cpu_user"), 64)
	sys, _ := strconv.ParseFloat(benchutil.InfoField(info, "used_cpu_sys"), 64)
	var c counters
	c.cpu = time.Duration((user + sys) * float64(time.Second))
	c.cmds, _ = strconv.ParseInt(benchutil.InfoField(info, "total_commands_processed"), 10, 64)
	c.mem, _ = strconv.ParseInt(benchutil.InfoField(info, "used_memory"), 10, 64)
	return c
}

func readAll(ctx context.Context, ns []node) []counters {
	out := make([]counters, len(ns))
	for i, n := range ns {
		out[i] = read(ctx, n.rdb)
	}
	return out
}

func cleanup(s *side, base string) {
	ctx := context.Background()
	del := func(c *redis.Client) {
		for _, p := range []string{base + "*", "asynq:{" + base + "*"} {
			iter := c.Scan(ctx, 0, p, 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
		}
	}
	for _, n := range s.primaries {
		del(n.rdb)
	}
	if qs, err := s.rdb.SMembers(ctx, "asynq:queues").Result(); err == nil {
		for _, q := range qs {
			if strings.HasPrefix(q, base) {
				s.rdb.SRem(ctx, "asynq:queues", q)
			}
		}
	}
}

func newServer(rdb redis.UniversalClient, queue string, conc int) *asynq.Server {
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:       conc,
		Queues:            map[string]int{queue: 1},
		TaskCheckInterval: *poll,
		LogLevel:          asynq.ErrorLevel,
	})
}

var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// job is a job of n pages whose Map takes a permit of sem, if not nil, and
// gives it back; perTask is its JobOptions.PagesPerTask.
func job(name, queue string, perTask int, sem *semaphore.Semaphore) mapreduce.Job[int, int, struct{}, int] {
	return mapreduce.Job[int, int, struct{}, int]{
		Name: name,
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(ctx context.Context, _ int) (struct{}, error) {
			if sem == nil {
				return struct{}{}, nil
			}
			p, err := sem.Acquire(ctx)
			if err != nil {
				return struct{}{}, err
			}
			return struct{}{}, p.Release(ctx)
		},
		Options: mapreduce.JobOptions{Queue: queue, Retention: time.Minute, AllowOverlap: true,
			Semantics: mapreduce.CompleteSemantics, MapRetries: -1, PagesPerTask: perTask},
	}
}

// jobSpec names one job of the spread section and the primary its tags
// fall on.
type jobSpec struct {
	name, queue, sem string
	primary          int
	perTask          int // JobOptions.PagesPerTask (0: the default, packing)
}

// result is one side's round: pages run, wall time, and each node's use.
type result struct {
	pages   int
	wall    time.Duration
	use     []counters // primaries, deltas
	peakMem []int64    // primaries, above idle
	repCPU  time.Duration
	own     []int64 // primaries: bytes of the finished runs' ledgers
	waits   int64
}

// runJobs runs one run of n pages of each spec at once on s, each job with
// its own asynq server, and measures each primary.
func runJobs(ctx context.Context, s *side, prefix string, specs []jobSpec, n int, withPermits bool) result {
	c, mjobs, stop := startJobs(s, prefix, specs, withPermits)
	defer stop()
	time.Sleep(200 * time.Millisecond) // servers past their start
	waits0 := waitCalls(ctx, s)
	idle := readAll(ctx, s.primaries)
	rep0 := readAll(ctx, s.replicas)
	peak, stopSampling := samplePeakMemory(ctx, s, idle)
	start := time.Now()
	ids := runAll(ctx, c, mjobs, specs, n)
	wall := time.Since(start)
	stopSampling()
	after := readAll(ctx, s.primaries)
	r := result{pages: n * len(specs), wall: wall, peakMem: peak, own: make([]int64, len(s.primaries))}
	for i := range after {
		r.use = append(r.use, counters{cpu: after[i].cpu - idle[i].cpu, cmds: after[i].cmds - idle[i].cmds})
	}
	for i, rc := range readAll(ctx, s.replicas) {
		r.repCPU += rc.cpu - rep0[i].cpu
	}
	for i, sp := range specs {
		r.own[sp.primary] += benchutil.RunBytes(ctx, s.rdb, prefix, sp.name, ids[i])
	}
	r.waits = waitCalls(ctx, s) - waits0
	return r
}

// startJobs registers a job of each spec, with a semaphore of its own if
// withPermits, and starts an asynq server on each spec's queue; stop shuts
// them down and closes the semaphores.
func startJobs(s *side, prefix string, specs []jobSpec, withPermits bool) (c *mapreduce.Client, mjobs []mapreduce.Job[int, int, struct{}, int], stop func()) {
	js := mapreduce.NewJobs()
	var sems []*semaphore.Semaphore
	for _, sp := range specs {
		var sem *semaphore.Semaphore
		if withPermits {
			var err error
			sem, err = semaphore.New(s.rdb, sp.sem, semaphore.Options{Limit: *limit, Prefix: prefix + ":sem", Logger: logger})
			must(err)
			sems = append(sems, sem)
		}
		j := job(sp.name, sp.queue, sp.perTask, sem)
		must(mapreduce.AddJob(js, j))
		mjobs = append(mjobs, j)
	}
	var srvs []*asynq.Server
	stop = func() {
		for i := len(srvs) - 1; i >= 0; i-- {
			srvs[i].Shutdown()
		}
		for _, sem := range sems {
			sem.Close()
		}
	}
	c, err := mapreduce.New(s.rdb, mapreduce.Config{Jobs: js, Prefix: prefix, Logger: logger})
	must(err)
	mux := asynq.NewServeMux()
	c.Register(mux)
	for _, sp := range specs {
		srv := newServer(s.rdb, sp.queue, *concurrency)
		must(srv.Start(mux))
		srvs = append(srvs, srv)
	}
	return c, mjobs, stop
}

// samplePeakMemory samples each primary's memory above idle every 50 ms
// until stop, after which peak holds the highest of each.
func samplePeakMemory(ctx context.Context, s *side, idle []counters) (peak []int64, stop func()) {
	peak = make([]int64, len(s.primaries))
	stopped := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			for i, nd := range s.primaries {
				peak[i] = max(peak[i], read(ctx, nd.rdb).mem-idle[i].mem)
			}
			select {
			case <-stopped:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return peak, func() {
		close(stopped)
		<-sampled
	}
}

// runAll starts a run of n pages of each job of mjobs at once and waits
// for them all to succeed; it returns their IDs.
func runAll(ctx context.Context, c *mapreduce.Client, mjobs []mapreduce.Job[int, int, struct{}, int], specs []jobSpec, n int) []string {
	ids := make([]string, len(specs))
	var wg sync.WaitGroup
	for i := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := mjobs[i].Start(ctx, c, n, mapreduce.StartOptions{})
			must(err)
			ids[i] = id
			for {
				st, err := c.Status(ctx, id)
				must(err)
				if st.State.Ended() {
					if st.State != mapreduce.StateSucceeded {
						must(fmt.Errorf("run %s of %s ended %s: %s", id, specs[i].name, st.State, st.Error))
					}
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return ids
}

// waitCalls is how many WAIT commands s's primaries have run.
func waitCalls(ctx context.Context, s *side) int64 {
	var n int64
	for _, nd := range s.primaries {
		st, err := benchutil.CommandStats(ctx, nd.rdb)
		must(err)
		n += st["wait"].Calls
	}
	return n
}

func spread(ctx context.Context, cl, std *side, base string) {
	np := len(cl.primaries)
	specs := make([]jobSpec, *jobs)
	for i := range specs {
		p := i % np
		specs[i] = jobSpec{
			name:    cl.tagOn(ctx, fmt.Sprintf("job%d-", i), p),
			queue:   cl.tagOn(ctx, fmt.Sprintf("%s-q%d-", base, i), p),
			sem:     cl.tagOn(ctx, fmt.Sprintf("sem%d-", i), p),
			primary: p,
		}
	}
	stdSpecs := slices.Clone(specs)
	for i := range stdSpecs {
		stdSpecs[i].primary = 0
	}
	var cr, sr []result
	for r := range *rounds {
		cr = append(cr, runJobs(ctx, cl, fmt.Sprintf("%s:c%d", base, r), specs, *pages, *permits))
		sr = append(sr, runJobs(ctx, std, fmt.Sprintf("%s:s%d", base, r), stdSpecs, *pages, *permits))
	}
	rate := func(rs []result) (float64, []float64) {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, float64(r.pages)/r.wall.Seconds())
		}
		return benchutil.Median(xs), xs
	}
	c, cs := rate(cr)
	s, ss := rate(sr)
	what := "no-op Map"
	if *permits {
		what = fmt.Sprintf("Map takes a permit of its job's semaphore (limit %d, holds of 0)", *limit)
	}
	fmt.Printf("## Spread: %d jobs at once, %d pages each, %s; a queue, a semaphore and an asynq server (concurrency %d) per job; %d interleaved rounds\n\n",
		*jobs, *pages, what, *concurrency, *rounds)
	fmt.Println("| | Cluster (3 primaries, a replica each) | standalone Redis (no replica) | Cluster / standalone |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| pages/s, all jobs, median | **%.0f** | **%.0f** | **%.2f** |\n", c, s, c/s)
	fmt.Printf("| pages/s, each round | %s | %s | |\n", benchutil.Floats(cs, 0), benchutil.Floats(ss, 0))
	cw, sw := float64(0), float64(0)
	for i := range cr {
		cw += float64(cr[i].waits) / float64(cr[i].pages)
		sw += float64(sr[i].waits) / float64(sr[i].pages)
	}
	fmt.Printf("| WAIT commands per page | %.2f | %.2f | |\n\n", cw/float64(len(cr)), sw/float64(len(sr)))
	perPrimary(cl, specs, cr)
	perPrimary(std, stdSpecs, sr)
}

// perPrimary prints each primary's share of a side's load, and its cost
// per page, medians over the rounds.
func perPrimary(s *side, specs []jobSpec, rs []result) {
	window := min(10_000, *pages)
	fmt.Printf("%s, per primary (medians of %d rounds):\n\n", s.name, len(rs))
	fmt.Println("| primary | jobs | share of commands | share of CPU | CPU busy | commands/page | CPU µs/page | memory at peak above idle | peak above idle per page of the live windows | finished ledger bytes/page |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for p, nd := range s.primaries {
		var jobsOn int
		for _, sp := range specs {
			if sp.primary == p {
				jobsOn++
			}
		}
		med := func(f func(r result) float64) float64 { return benchutil.MedianOf(rs, f) }
		total := func(r result, f func(counters) float64) float64 {
			var t float64
			for _, u := range r.use {
				t += f(u)
			}
			return t
		}
		cmds := func(u counters) float64 { return float64(u.cmds) }
		cpu := func(u counters) float64 { return float64(u.cpu.Microseconds()) }
		pagesOn := func(r result) float64 { return float64(r.pages) * float64(jobsOn) / float64(len(specs)) }
		fmt.Printf("| %s | %d | %.0f%% | %.0f%% | %.0f%% | %.1f | %.0f | %.1f MiB | %.0f | %.1f |\n", nd.addr, jobsOn,
			med(func(r result) float64 { return 100 * cmds(r.use[p]) / total(r, cmds) }),
			med(func(r result) float64 { return 100 * cpu(r.use[p]) / total(r, cpu) }),
			med(func(r result) float64 { return 100 * r.use[p].cpu.Seconds() / r.wall.Seconds() }),
			med(func(r result) float64 { return cmds(r.use[p]) / pagesOn(r) }),
			med(func(r result) float64 { return cpu(r.use[p]) / pagesOn(r) }),
			med(func(r result) float64 { return float64(r.peakMem[p]) / (1 << 20) }),
			med(func(r result) float64 { return float64(r.peakMem[p]) / float64(window*jobsOn) }),
			med(func(r result) float64 { return float64(r.own[p]) / pagesOn(r) }))
	}
	if len(s.replicas) > 0 {
		perPage := benchutil.MedianOf(rs, func(r result) float64 { return float64(r.repCPU.Microseconds()) / float64(r.pages) })
		fmt.Printf("\nReplicas, all %d: %.0f CPU µs/page of the whole run.\n", len(s.replicas), perPage)
	}
	fmt.Println()
}

// grants saturates one semaphore per primary of the Cluster, and as many
// on the standalone Redis, and prints grants/s and each primary's cost.
func grants(ctx context.Context, cl, std *side, base string) {
	np := len(cl.primaries)
	names := make([]string, np)
	for p := range names {
		names[p] = cl.tagOn(ctx, "grants", p)
	}
	var crs, nrs, srs []grantResult
	for r := range *rounds {
		crs = append(crs, grantRound(ctx, cl, names, fmt.Sprintf("%s:gc%d", base, r), 0))
		nrs = append(nrs, grantRound(ctx, cl, names, fmt.Sprintf("%s:gn%d", base, r), -1))
		srs = append(srs, grantRound(ctx, std, names, fmt.Sprintf("%s:gs%d", base, r), 0))
	}
	noWait := *cl
	noWait.name = "Cluster, ReplicaWait -1 (no WAIT)"
	fmt.Printf("## Grants at saturation: %d semaphores (one per Cluster primary), limit %d, %d handles of %d goroutines each, holds of 0, %v runs, %d interleaved rounds\n\n",
		np, *grantLimit, *grantHandles, *grantGo, *grantDur, *rounds)
	fmt.Println("| side | primary | grants/s, median | CPU busy | Redis CPU µs/grant | commands/grant |")
	fmt.Println("|---|---|---|---|---|---|")
	printGrants(cl, crs)
	printGrants(&noWait, nrs)
	printGrants(std, srs)
	fmt.Println()
}

// grantResult is one side's round of the grants section.
type grantResult struct {
	per  []int64 // grants per semaphore
	use  []counters
	wall time.Duration
}

// total is the grants of every semaphore.
func (r grantResult) total() int64 {
	var t int64
	for _, g := range r.per {
		t += g
	}
	return t
}

// grantRound saturates a semaphore of each name on s, with -grant-handles
// handles of -grant-goroutines goroutines each, for -grant-duration, and
// measures each primary.
func grantRound(ctx context.Context, s *side, names []string, prefix string, replicaWait time.Duration) grantResult {
	var sems [][]*semaphore.Semaphore // by semaphore, its handles
	for _, n := range names {
		var hs []*semaphore.Semaphore
		for range *grantHandles {
			sem, err := semaphore.New(s.rdb, n, semaphore.Options{Limit: *grantLimit, Prefix: prefix, Logger: logger, ReplicaWait: replicaWait})
			must(err)
			defer sem.Close()
			p, err := sem.Acquire(ctx) // the limit written, replicas counted
			must(err)
			must(p.Release(ctx))
			hs = append(hs, sem)
		}
		sems = append(sems, hs)
	}
	counts := make([]atomic.Int64, len(sems))
	before := readAll(ctx, s.primaries)
	start := time.Now()
	deadline := start.Add(*grantDur)
	var wg sync.WaitGroup
	for i, hs := range sems {
		for j := range *grantGo * len(hs) {
			sem := hs[j%len(hs)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					p, err := sem.Acquire(ctx)
					must(err)
					must(p.Release(ctx))
					counts[i].Add(1)
				}
			}()
		}
	}
	wg.Wait()
	r := grantResult{wall: time.Since(start)}
	for i, a := range readAll(ctx, s.primaries) {
		r.use = append(r.use, counters{cpu: a.cpu - before[i].cpu, cmds: a.cmds - before[i].cmds})
	}
	for i := range counts {
		r.per = append(r.per, counts[i].Load())
	}
	return r
}

// printGrants prints the grants table's rows of side s, from its rounds
// rs: one per primary, then all.
func printGrants(s *side, rs []grantResult) {
	var totals []float64
	for _, r := range rs {
		totals = append(totals, float64(r.total())/r.wall.Seconds())
	}
	for p, nd := range s.primaries {
		med := func(f func(r grantResult) float64) float64 { return benchutil.MedianOf(rs, f) }
		g := func(r grantResult) float64 { // the grants this primary gave
			if len(s.primaries) == 1 {
				return float64(r.total())
			}
			return float64(r.per[p])
		}
		fmt.Printf("| %s | %s | %.0f | %.0f%% | %.0f | %.1f |\n", s.name, nd.addr,
			med(func(r grantResult) float64 { return g(r) / r.wall.Seconds() }),
			med(func(r grantResult) float64 { return 100 * r.use[p].cpu.Seconds() / r.wall.Seconds() }),
			med(func(r grantResult) float64 { return float64(r.use[p].cpu.Microseconds()) / g(r) }),
			med(func(r grantResult) float64 { return float64(r.use[p].cmds) / g(r) }))
	}
	fmt.Printf("| %s | all | **%.0f** (rounds: %s) | | | |\n", s.name, benchutil.Median(totals), benchutil.Floats(totals, 0))
}

// replicaCost runs one job's run on the primary with a replica and on the
// standalone Redis, interleaved, as the job packs pages by default and with
// a task a page, and prints pages/s and the ratios.
func replicaCost(ctx context.Context, sen, std *side, base string) {
	fmt.Printf("## The ledger's WAIT: a %d-page run, no-op Map, no permits, on a primary with a replica and on a Redis without one (%d interleaved rounds)\n\n", *replicaPages, *rounds)
	fmt.Println("| pages | with a replica: pages/s, median | without: pages/s, median | ratio | WAIT commands per page, with | primary's CPU µs/page, with / without | pages/s each round, with; without |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, v := range []struct {
		name    string
		perTask int
	}{{"packed (the default)", 0}, {"a task a page (PagesPerTask 1)", 1}} {
		spec := []jobSpec{{name: "replica", queue: base + "-replica", perTask: v.perTask}}
		var wr, nr []result
		for r := range *rounds {
			wr = append(wr, runJobs(ctx, sen, fmt.Sprintf("%s:w%d%d", base, v.perTask, r), spec, *replicaPages, false))
			nr = append(nr, runJobs(ctx, std, fmt.Sprintf("%s:n%d%d", base, v.perTask, r), spec, *replicaPages, false))
		}
		rates := func(rs []result) []float64 {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, float64(r.pages)/r.wall.Seconds())
			}
			return xs
		}
		per := func(rs []result, f func(result) float64) float64 {
			return benchutil.MedianOf(rs, func(r result) float64 { return f(r) / float64(r.pages) })
		}
		cpu := func(r result) float64 { return float64(r.use[0].cpu.Microseconds()) }
		w, n := rates(wr), rates(nr)
		fmt.Printf("| %s | %.0f | %.0f | **%.2f** | %.2f | %.0f / %.0f | %s; %s |\n", v.name,
			benchutil.Median(w), benchutil.Median(n), benchutil.Median(w)/benchutil.Median(n),
			per(wr, func(r result) float64 { return float64(r.waits) }), per(wr, cpu), per(nr, cpu), benchutil.Floats(w, 0), benchutil.Floats(n, 0))
	}
	fmt.Println()
}

func fail(code int, msg string) {
	fmt.Fprintln(os.Stderr, "clusterbench:", msg)
	os.Exit(code)
}

func must(err error) {
	if err != nil {
		fail(1, err.Error())
	}
}
