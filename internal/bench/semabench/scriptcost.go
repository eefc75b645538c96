package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	scriptCalls  = flag.Int("script-calls", 2000, "calls per path in the scripts section")
	callgrind    = flag.String("callgrind", "", "the scripts section's Redis runs under valgrind --tool=callgrind with this --callgrind-out-file, as process -callgrind-pid: also count the instructions each call costs it (scripts/script-cost.sh)")
	callgrindPID = flag.Int("callgrind-pid", 0, "see -callgrind")
)

// scriptPath is one of the calls the scripts section measures: how it is
// set up, and the calls it sends, all at once in one pipeline, so that
// Redis runs them back to back.
type scriptPath struct {
	name, about string
	fn          string // the library's function: acquire, release or carry
	status      int64  // the status every call of the path answers (release.lua, acquire.lua)
	setup       func(ctx context.Context, rdb *redis.Client, keys []string, n int)
	args        func(i int) []any
}

// The waiters' process, and the hand-off's releasing holder.
const costSelf = "q"

func costToken(i int) string { return costSelf + ":" + strconv.Itoa(i) + ":1" }

var scriptPaths = []scriptPath{
	{
		name: "hand-off", fn: "release", status: 3,
		about: "a release whose permit goes straight to the queue's head (the short hand-off), under contention",
		setup: func(ctx context.Context, rdb *redis.Client, keys []string, n int) {
			// Limit 1, held by token 0; tokens 1..n queued, alive. Call i
			// releases token i, granted by call i-1.
			pipe, far := heldByOne(ctx, rdb, keys, costToken(0))
			for i := 1; i <= n; i++ {
				pipe.ZAdd(ctx, keys[2], redis.Z{Score: float64(i), Member: costToken(i)})
				pipe.ZAdd(ctx, keys[3], redis.Z{Score: far, Member: costToken(i)})
				pipe.HSet(ctx, keys[4], costToken(i), "1")
			}
			pipe.Set(ctx, keys[6], strconv.Itoa(n), 0)
			_, err := pipe.Exec(ctx)
			must(err)
		},
		args: func(i int) []any { return []any{costToken(i), 30000, 30000, "1", "20:o"} },
	},
	{
		name: "enqueue", fn: "acquire", status: 0,
		about: "an Acquire that waits behind a full semaphore (acquire's short step)",
		setup: func(ctx context.Context, rdb *redis.Client, keys []string, n int) {
			pipe, _ := heldByOne(ctx, rdb, keys, "x:0:1")
			_, err := pipe.Exec(ctx)
			must(err)
		},
		args: func(i int) []any { return []any{costToken(i + 1), 30000, 30000, "1", "0"} },
	},
	{
		name: "acquire", fn: "acquire", status: 1,
		about: "an uncontended Acquire, granted at once (the whole script)",
		setup: func(ctx context.Context, rdb *redis.Client, keys []string, n int) {
			must(rdb.Set(ctx, keys[0], strconv.Itoa(2*n), 0).Err())
		},
		args: func(i int) []any { return []any{costToken(i + 1), 30000, 30000, "1", "0"} },
	},
	{
		name: "release", fn: "release", status: 1,
		about: "an uncontended release, nobody waiting (the whole script)",
		setup: func(ctx context.Context, rdb *redis.Client, keys []string, n int) {
			// n holders with a record that names them.
			far := float64(time.Now().Add(time.Hour).UnixMilli())
			pipe := rdb.Pipeline()
			pipe.Set(ctx, keys[0], strconv.Itoa(2*n), 0)
			for i := 1; i <= n; i++ {
				pipe.ZAdd(ctx, keys[1], redis.Z{Score: far, Member: costToken(i)})
				pipe.HSet(ctx, keys[4], costToken(i), strconv.Itoa(i)+":1")
			}
			pipe.Set(ctx, keys[5], strconv.Itoa(n), 0)
			pipe.Set(ctx, keys[7], fmt.Sprintf("%d:%d:%d", n, n, n), 0)
			_, err := pipe.Exec(ctx)
			must(err)
		},
		args: func(i int) []any { return []any{costToken(i + 1), 30000, 30000, "1", "20:o"} },
	},
}

// heldByOne starts a pipeline that sets up a semaphore of limit 1 held by
// tok, with a held record that names it, and returns it with the lease
// deadline it gave tok, an hour away.
func heldByOne(ctx context.Context, rdb *redis.Client, keys []string, tok string) (redis.Pipeliner, float64) {
	far := float64(time.Now().Add(time.Hour).UnixMilli())
	pipe := rdb.Pipeline()
	pipe.Set(ctx, keys[0], "1", 0)
	pipe.ZAdd(ctx, keys[1], redis.Z{Score: far, Member: tok})
	pipe.HSet(ctx, keys[4], tok, "1:1")
	pipe.Set(ctx, keys[5], "1", 0)
	pipe.Set(ctx, keys[7], "1:1:1", 0)
	return pipe, far
}

// scriptCost is what Redis spends on one call of each path: µs from INFO
// commandstats and, under callgrind, instructions, which do not vary with
// the machine's load or speed from one run to the next.
type scriptCost struct {
	Path         string  `json:"path"`
	Micros       float64 `json:"us"`
	Instructions float64 `json:"instructions,omitempty"`
}

// scriptCosts measures this build's scripts: one pipeline of -script-calls
// calls per path, on keys of its own. With -before-exe the other build
// measures its own the same way, on the same server, after this one.
func scriptCosts(ctx context.Context, rdb *redis.Client, prefix string) {
	if err := rdb.Do(ctx, "FUNCTION", "LIST", "LIBRARYNAME", "-").Err(); err != nil {
		fmt.Printf("## 7. Script paths: skipped, the server has no functions (%v)\n\n", err)
		return
	}
	mine := measureScripts(ctx, rdb, prefix)
	var before []scriptCost
	if *beforeExe != "" {
		out, err := exec.Command(*beforeExe, "-redis", *redisURL, "-worker", "scripts", "-prefix", prefix+":before",
			"-script-calls", strconv.Itoa(*scriptCalls), "-callgrind", *callgrind, "-callgrind-pid", strconv.Itoa(*callgrindPID)).Output()
		must(err)
		must(json.Unmarshal(out, &before))
	}
	fmt.Printf("## 7. What Redis spends on one call of each script path (%d calls per path, pipelined)\n\n", *scriptCalls)
	head := "| path | Redis µs/call |"
	rule := "|---|---|"
	if *callgrind != "" {
		head += " instructions/call |"
		rule += "---|"
	}
	if before != nil {
		head += " before: µs/call |"
		rule += "---|"
		if *callgrind != "" {
			head += " before: instructions/call | instructions, this build / before |"
			rule += "---|---|"
		}
	}
	fmt.Println(head + " what it is |")
	fmt.Println(rule + "---|")
	for i, c := range mine {
		row := fmt.Sprintf("| %s | %.1f |", c.Path, c.Micros)
		if *callgrind != "" {
			row += fmt.Sprintf(" %.0f |", c.Instructions)
		}
		if before != nil {
			b := before[i]
			row += fmt.Sprintf(" %.1f |", b.Micros)
			if *callgrind != "" {
				row += fmt.Sprintf(" %.0f | **%.3f** |", b.Instructions, c.Instructions/b.Instructions)
			}
		}
		fmt.Println(row + " " + scriptPaths[i].about + " |")
	}
	fmt.Println()
}

// measureScripts runs every path against this build's function library.
func measureScripts(ctx context.Context, rdb *redis.Client, prefix string) []scriptCost {
	version := libraryVersion(ctx, rdb, prefix)
	var out []scriptCost
	for _, p := range scriptPaths {
		names := []string{"limit", "holders", "queue", "alive", "info", "fence", "ticket", "held", "auto", "signals", "control"}
		keys := make([]string, len(names))
		for i, k := range names {
			keys[i] = prefix + ":" + p.name + ":{cost}:" + k
		}
		must(rdb.Del(ctx, keys...).Err())
		p.setup(ctx, rdb, keys, *scriptCalls)
		fn := "batchmr_sem_" + p.fn + "_" + version
		pipe := rdb.Pipeline()
		for i := 0; i < *scriptCalls; i++ {
			pipe.FCall(ctx, fn, keys, append([]any{prefix + ":wake:", 1, 60000, costSelf}, p.args(i)...)...)
		}
		usage0 := commandUsage(ctx, rdb)["fcall"]
		callgrindControl("-z")
		cmds, err := pipe.Exec(ctx)
		must(err)
		instr := callgrindControl("-d")
		usage1 := commandUsage(ctx, rdb)["fcall"]
		checkPath(p, cmds)
		c := scriptCost{Path: p.name, Micros: float64(usage1.Usec-usage0.Usec) / float64(usage1.Calls-usage0.Calls)}
		if *callgrind != "" {
			c.Instructions = float64(instr) / float64(*scriptCalls)
		}
		out = append(out, c)
		must(rdb.Del(ctx, keys...).Err())
	}
	return out
}

// checkPath fails the run if the calls did not take the path measured.
func checkPath(p scriptPath, cmds []redis.Cmder) {
	for _, i := range []int{0, len(cmds) / 2, len(cmds) - 1} {
		v, err := cmds[i].(*redis.Cmd).Slice()
		if err != nil || len(v) == 0 || v[0] != p.status {
			fmt.Fprintf(os.Stderr, "semabench: scripts: call %d of path %s answered %v (%v), want status %d\n", i, p.name, v, err, p.status)
			os.Exit(1)
		}
	}
}

// libraryVersion makes one Acquire and Release, so that this build's
// library is loaded, and returns the version its function names end in.
func libraryVersion(ctx context.Context, rdb *redis.Client, prefix string) string {
	opt := *rdb.Options()
	c := redis.NewClient(&opt)
	defer c.Close()
	seen := &fcallNames{}
	c.AddHook(seen)
	s := newSem(c, prefix+":load", 1)
	p, err := s.Acquire(ctx)
	must(err)
	must(p.Release(ctx))
	must(s.Close())
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for _, name := range seen.names {
		if v, ok := strings.CutPrefix(name, "batchmr_sem_acquire_"); ok {
			return v
		}
	}
	fmt.Fprintf(os.Stderr, "semabench: scripts: the semaphore sent no FCALL (%v): this section needs Redis 7 functions\n", seen.names)
	os.Exit(1)
	return ""
}

// fcallNames records the functions a client calls.
type fcallNames struct {
	mu    sync.Mutex
	names []string
}

func (f *fcallNames) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *fcallNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && strings.EqualFold(cmd.Name(), "fcall") {
			f.mu.Lock()
			f.names = append(f.names, fmt.Sprint(args[1]))
			f.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (f *fcallNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// callgrindControl runs callgrind_control with op against the Redis server
// under -callgrind, if any: -z zeroes its counts, -d dumps them and returns
// the instructions counted since the last zero.
func callgrindControl(op string) int64 {
	if *callgrind == "" {
		return 0
	}
	before, _ := filepath.Glob(*callgrind + ".*")
	out, err := exec.Command("callgrind_control", op, strconv.Itoa(*callgrindPID)).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "semabench: callgrind_control %s: %v: %s\n", op, err, out)
		os.Exit(1)
	}
	if op != "-d" {
		return 0
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		after, _ := filepath.Glob(*callgrind + ".*")
		for _, f := range after {
			if !slices.Contains(before, f) {
				return callgrindTotal(f)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "semabench: callgrind_control -d wrote no new %s.* file\n", *callgrind)
	os.Exit(1)
	return 0
}

// callgrindTotal reads a callgrind dump's total instruction count (its
// "summary:" line, written last), waiting for the dump to be complete.
func callgrindTotal(file string) int64 {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		data, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "summary: "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				must(err)
				return n
			}
		}
	}
	fmt.Fprintf(os.Stderr, "semabench: no summary in %s\n", file)
	os.Exit(1)
	return 0
}
