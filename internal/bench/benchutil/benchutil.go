// Package benchutil holds what the benchmark commands (internal/bench/...)
// share: connecting to the Redis they measure, reading INFO, cleaning up.
package benchutil

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis connects the benchmark command named cmd to the server at url, with
// room for poolSize connections (0: go-redis's default). It exits with a
// message naming the fix when url is empty, malformed or unreachable.
func Redis(cmd, url string, poolSize int) *redis.Client {
	if url == "" {
		fmt.Fprintf(os.Stderr, "%s: no Redis: pass -redis URL or set BATCHMR_TEST_REDIS_URL (make bench does both)\n", cmd)
		os.Exit(2)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: -redis %q: %v\n", cmd, url, err)
		os.Exit(2)
	}
	if poolSize > 0 {
		opt.PoolSize = poolSize
	}
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: Redis at %s: %v\n", cmd, opt.Addr, err)
		os.Exit(1)
	}
	return rdb
}

// InfoField returns one field of an INFO reply, or "?".
func InfoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return "?"
}

// CommandStat is one command's line of INFO commandstats: how often Redis
// ran it (from a client or inside a script), the µs it spent in it (a
// script's include those of the commands it ran), and how often it refused
// it (an ACL, maxmemory). A blocking command counts once it is served or
// times out.
type CommandStat struct{ Calls, Usec, Rejected int64 }

// CommandStats reads INFO commandstats, by command name ("fcall",
// "config|resetstat").
func CommandStats(ctx context.Context, rdb *redis.Client) (map[string]CommandStat, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]CommandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var c CommandStat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				c.Calls = n
			case "usec":
				c.Usec = n
			case "rejected_calls":
				c.Rejected = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = c
	}
	return out, nil
}

// DeleteMatching deletes every key matching each pattern.
func DeleteMatching(rdb *redis.Client, patterns ...string) {
	ctx := context.Background()
	for _, p := range patterns {
		iter := rdb.Scan(ctx, 0, p, 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	}
}

// Median returns the median of xs (the upper one of an even count).
func Median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// MedianOf returns the median of f over xs (the upper one of an even
// count).
func MedianOf[T any](xs []T, f func(T) float64) float64 {
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = f(x)
	}
	return Median(vs)
}

// Floats formats xs with prec decimals, separated by spaces.
func Floats(xs []float64, prec int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(parts, " ")
}

// RunBytes returns what the keys of run id of job, under the mapreduce
// prefix, take in Redis (MEMORY USAGE): once the run ended, its ledger.
func RunBytes(ctx context.Context, rdb redis.Cmdable, prefix, job, id string) int64 {
	var n int64
	for _, kind := range []string{"run", "recorded", "results", "failures"} {
		b, _ := rdb.MemoryUsage(ctx, prefix+":{"+job+"}:"+kind+":"+id, 0).Result()
		n += b
	}
	return n
}

// RedisCPU returns the CPU time Redis has used, user and system, from
// INFO cpu.
func RedisCPU(ctx context.Context, rdb *redis.Client) time.Duration {
	return TakeUse(ctx, rdb).RedisCPU
}

// Use is what a measured stretch cost: the CPU time of Redis and of this
// process, and the commands and client reads (round trips: a pipeline is
// one read, or a few for a long one) Redis processed. TakeUse reads the
// counters; the difference of two readings is what happened between.
type Use struct {
	RedisCPU, OwnCPU time.Duration
	Commands, Reads  int64
}

// TakeUse reads Redis's INFO cpu and stats, and this process's rusage.
func TakeUse(ctx context.Context, rdb *redis.Client) Use {
	var u Use
	if info, err := rdb.Info(ctx, "cpu", "stats").Result(); err == nil {
		user, _ := strconv.ParseFloat(InfoField(info, "used_cpu_user"), 64)
		sys, _ := strconv.ParseFloat(InfoField(info, "used_cpu_sys"), 64)
		u.RedisCPU = time.Duration((user + sys) * float64(time.Second))
		u.Commands, _ = strconv.ParseInt(InfoField(info, "total_commands_processed"), 10, 64)
		u.Reads, _ = strconv.ParseInt(InfoField(info, "total_reads_processed"), 10, 64)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.OwnCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return u
}

// Sub returns what was used between before and u.
func (u Use) Sub(before Use) Use {
	return Use{RedisCPU: u.RedisCPU - before.RedisCPU, OwnCPU: u.OwnCPU - before.OwnCPU,
		Commands: u.Commands - before.Commands, Reads: u.Reads - before.Reads}
}
