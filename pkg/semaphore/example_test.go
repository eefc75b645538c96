package semaphore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// exampleRedis connects to the test server (make test sets
// BATCHMR_TEST_REDIS_URL) and returns a key prefix unique to this run, whose
// keys it deletes in cleanup. A real program uses its own client and the
// default prefix.
func exampleRedis() (rdb *redis.Client, prefix string, cleanup func()) {
	opt, err := redis.ParseURL(os.Getenv("BATCHMR_TEST_REDIS_URL"))
	if err != nil {
		panic("examples need BATCHMR_TEST_REDIS_URL (make test sets it): " + err.Error())
	}
	rdb = redis.NewClient(opt)
	prefix = "bmrexample:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	return rdb, prefix, func() {
		ctx := context.Background()
		for _, k := range rdb.Keys(ctx, prefix+"*").Val() {
			rdb.Del(ctx, k)
		}
		rdb.Close()
	}
}

// The happy path: acquire a permit, work under its context, release it.
func Example() {
	rdb, prefix, cleanup := exampleRedis()
	defer cleanup()
	ctx := context.Background()

	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 2, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer sem.Close()

	p, err := sem.Acquire(ctx) // blocks while the fleet holds all permits
	if err != nil {
		panic(err)
	}
	// Pass p.Context() to the query: it is cancelled if the lease is lost.
	st, _ := sem.Stats(ctx)
	fmt.Println("held:", st.Held, "of", st.Limit)
	if err := p.Release(ctx); err != nil {
		panic(err) // errors.Is(err, semaphore.ErrLeaseLost): the work may have overlapped another holder's
	}
	// Output: held: 1 of 2
}

// Do acquires, runs the function under the permit's context and releases,
// even if the function panics.
func ExampleSemaphore_Do() {
	rdb, prefix, cleanup := exampleRedis()
	defer cleanup()
	ctx := context.Background()
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer sem.Close()

	err = sem.Do(ctx, func(ctx context.Context) error {
		fmt.Println("querying the database under a permit")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// querying the database under a permit
	// err: <nil>
}

// Operators change the fleet-wide limit live; raising it wakes waiters now.
func ExampleSemaphore_SetLimit() {
	rdb, prefix, cleanup := exampleRedis()
	defer cleanup()
	ctx := context.Background()
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer sem.Close()

	p, _ := sem.Acquire(ctx)
	granted := make(chan *semaphore.Permit)
	go func() {
		q, _ := sem.Acquire(ctx) // waits: the only permit is held
		granted <- q
	}()
	// Until Redis shows it queued: each Stats is a round trip.
	for st, _ := sem.Stats(ctx); len(st.Waiters) == 0; st, _ = sem.Stats(ctx) {
	}
	if err := sem.SetLimit(ctx, 2); err != nil {
		panic(err)
	}
	q := <-granted
	st, _ := sem.Stats(ctx)
	fmt.Println("held:", st.Held, "of", st.Limit)
	_ = q.Release(ctx)
	_ = p.Release(ctx)
	// Output: held: 2 of 2
}

// TryAcquire never waits: it fails with ErrNoPermit when the fleet holds
// every permit.
func ExampleSemaphore_TryAcquire() {
	rdb, prefix, cleanup := exampleRedis()
	defer cleanup()
	ctx := context.Background()
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 1, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer sem.Close()

	p, _ := sem.TryAcquire(ctx)
	_, err = sem.TryAcquire(ctx)
	fmt.Println(err)
	_ = p.Release(ctx)
	// Output: semaphore "db": try acquire: no permit available
}

// Auto mode: the operator sets bounds, every process runs a candidate
// for the controller, and the one elected moves the limit within them
// from what the releases report (Do reports its function's error; with
// Acquire, call Permit.Report before Release).
func ExampleSemaphore_RunController() {
	rdb, prefix, cleanup := exampleRedis()
	defer cleanup()
	ctx, stop := context.WithCancel(context.Background())
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 8, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	defer stop() // the work and the controller end before the handle closes

	// The operator's call (scheduler permits auto db --min 1 --max 16).
	if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: 1, Max: 16}); err != nil {
		panic(err)
	}
	// Each process's call; Probe (pgsource.NewProbe(pool).Run) tells the
	// controller whether Postgres has CPU to spare.
	go func() { _ = sem.RunController(ctx, semaphore.ControllerOptions{Window: 100 * time.Millisecond}) }()

	go func() { // the work, whose hold times the controller reads
		for ctx.Err() == nil {
			_ = sem.Do(ctx, func(ctx context.Context) error {
				time.Sleep(2 * time.Millisecond)
				return nil
			})
		}
	}()
	st, _ := sem.Stats(ctx)
	for i := 0; i < 100 && st.Auto.Why != "controller"; i++ {
		time.Sleep(100 * time.Millisecond) // a few windows, until it moves N
		st, _ = sem.Stats(ctx)
	}
	fmt.Println(st.Auto.Mode, st.Auto.Min, st.Auto.Max, st.Auto.Why)
	// Output: auto 1 16 controller
}
