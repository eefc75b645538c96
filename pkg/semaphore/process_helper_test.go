package semaphore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// runHelper is the body of a helper subprocess. Roles:
//
//	hold:  acquire one permit, say "fence N", then report a lost lease
//	       ("lost CAUSE") when it happens; on a "release" line from stdin,
//	       release and say "released ERR".
//	wait:  acquire one permit (the caller sees it queued in Stats), say
//	       "fence N" when granted, then hold until killed.
//	churn: SEMTEST_GOROUTINES goroutines acquire a random weight up to
//	       SEMTEST_MAXW, add it to the shared counter key, check the counter
//	       never exceeds the limit, hold ~1ms, subtract and release, for
//	       SEMTEST_ITERS rounds each; say "fence N" for every grant and
//	       "violation ..." for every breach, then "done".
func runHelper(role string) int {
	opt, err := redis.ParseURL(os.Getenv(testenv.RedisURLVar))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	lease, _ := time.ParseDuration(envOr("SEMTEST_LEASE", "30s"))
	limit, _ := strconv.Atoi(envOr("SEMTEST_LIMIT", "1"))
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: limit, Lease: lease, Prefix: os.Getenv("SEMTEST_PREFIX")})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer sem.Close()
	ctx := context.Background()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}

	switch role {
	case "hold":
		p, err := sem.Acquire(ctx)
		if err != nil {
			say("error %v", err)
			return 1
		}
		say("fence %d", p.Fence())
		go func() {
			<-p.Context().Done()
			say("lost %v", context.Cause(p.Context()))
		}()
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() == "release" {
				err := p.Release(ctx)
				say("released %v", err)
				if errors.Is(err, semaphore.ErrLeaseLost) {
					say("released-lost")
				}
			}
		}
		return 0
	case "wait":
		p, err := sem.Acquire(ctx)
		if err != nil {
			say("error %v", err)
			return 1
		}
		say("fence %d", p.Fence())
		select {}
	case "churn":
		goroutines, _ := strconv.Atoi(envOr("SEMTEST_GOROUTINES", "8"))
		iters, _ := strconv.Atoi(envOr("SEMTEST_ITERS", "50"))
		maxW, _ := strconv.Atoi(envOr("SEMTEST_MAXW", "1"))
		counter := os.Getenv("SEMTEST_PREFIX") + ":counter"
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < iters; i++ {
					w := 1 + rand.IntN(maxW)
					p, err := sem.AcquireN(ctx, w)
					if err != nil {
						say("error %v", err)
						return
					}
					say("fence %d", p.Fence())
					n, err := rdb.IncrBy(ctx, counter, int64(w)).Result()
					if err != nil {
						say("error %v", err)
					} else if n > int64(limit) {
						say("violation held %d > limit %d", n, limit)
					}
					time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Microsecond)
					if err := rdb.DecrBy(ctx, counter, int64(w)).Err(); err != nil {
						say("error %v", err)
					}
					if err := p.Release(ctx); err != nil {
						say("error %v", err)
					}
				}
			}()
		}
		wg.Wait()
		say("done")
		return 0
	}
	fmt.Println("error unknown role", role)
	return 2
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
