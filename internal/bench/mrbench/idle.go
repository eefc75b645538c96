package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

var (
	idlePolls    = flag.String("idle-polls", "1s,100ms", "the idle section's poll intervals, comma-separated; ratios are to the first")
	idleWorkers  = flag.Int("idle-workers", 20, "idle asynq servers in the idle section")
	idleQueues   = flag.Int("idle-queues", 8, "queues each idle server serves (a worker serves one per job)")
	idleDuration = flag.Duration("idle-duration", 10*time.Second, "how long the idle section measures each interval")
)

// idle runs the idle section: what a fleet of idle workers costs Redis at
// each poll interval. An asynq server that finds its queues empty asks
// again after its interval (0.5–1.5 times it), one script per queue, so
// the interval trades Redis load against how soon a step enqueued on idle
// workers starts.
func idle(ctx context.Context, rdb *redis.Client, base string, queues *[]string) {
	var polls []time.Duration
	for _, f := range strings.Split(*idlePolls, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "mrbench: -idle-polls %q: want positive durations, comma-separated, such as 1s,100ms\n", *idlePolls)
			os.Exit(2)
		}
		polls = append(polls, d)
	}
	fmt.Printf("## Idle workers: %d asynq servers of %d empty queues each, %v per poll interval\n\n", *idleWorkers, *idleQueues, *idleDuration)
	fmt.Println("| poll interval | Redis commands/s | Redis CPU, % of a core | per idle worker, % of a core | ratio of Redis CPU to the first |")
	fmt.Println("|---|---|---|---|---|")
	var first float64
	for i, poll := range polls {
		qs := map[string]int{}
		for q := range *idleQueues {
			name := fmt.Sprintf("%s-idle-%d-%d", base, i, q)
			qs[name] = 1
			*queues = append(*queues, name)
		}
		var srvs []*asynq.Server
		for range *idleWorkers {
			srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: qs, TaskCheckInterval: poll, LogLevel: asynq.ErrorLevel})
			must(srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
			srvs = append(srvs, srv)
		}
		time.Sleep(max(2*poll, time.Second)) // every server past its first look
		u0 := benchutil.TakeUse(ctx, rdb)
		time.Sleep(*idleDuration)
		u := benchutil.TakeUse(ctx, rdb).Sub(u0)
		for _, srv := range srvs {
			srv.Shutdown()
		}
		cpu := 100 * u.RedisCPU.Seconds() / idleDuration.Seconds()
		if i == 0 {
			first = cpu
		}
		fmt.Printf("| %v | %.0f | %.1f | %.2f | %.1f |\n", poll, float64(u.Commands)/idleDuration.Seconds(), cpu, cpu/float64(*idleWorkers), cpu/first)
	}
	fmt.Println()
}
