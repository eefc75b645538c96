package pgsource_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// helperEnv makes the test binary a holder process instead of running the
// tests; see runHolder.
const helperEnv = "PGSOURCE_TEST_HOLDER"

// TestMain lets the test binary double as a holder process that a test can
// pause (SIGSTOP) past its permits' lease.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHolder())
	}
	os.Exit(m.Run())
}

// runHolder is a worker in miniature: on a worker's pool, it runs
// `permits` long queries through pgsource.Exec under the semaphore, and
// prints "done ERROR" as each returns; it exits once all have.
func runHolder() int {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv(testenv.RedisURLVar))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	lease, _ := time.ParseDuration(os.Getenv("PGSOURCE_TEST_LEASE"))
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: permits, Lease: lease,
		Prefix: os.Getenv("PGSOURCE_TEST_PREFIX"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer sem.Close()
	pool, err := app.Postgres(ctx, os.Getenv(testenv.DatabaseURLVar), os.Getenv("PGSOURCE_TEST_APP"), 2*permits, pgsource.ConfigurePool)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer pool.Close()
	var out sync.Mutex
	wait := longQueries(ctx, pool, sem, permits)
	for _, err := range wait() {
		out.Lock()
		fmt.Printf("done %q\n", fmt.Sprint(err)) // one line: a joined error has several
		out.Unlock()
	}
	return 0
}

// A worker paused past its permits' lease (a GC pause, a frozen VM) loses
// them; when it resumes, its queries are cancelled (cause ErrLeaseLost), and
// the permits reach the waiters of another process only once those queries
// are gone from the server: Postgres never runs more than `permits` of them.
func TestAResumedHoldersLostPermitsReachWaitersOnlyOnceItsQueriesEnded(t *testing.T) {
	t.Parallel()
	const lease = 500 * time.Millisecond
	name := appName(t)
	pool := poolKinds[0].open(t, name)
	rdb, prefix := testenv.Redis(t)
	// The waiters' own lease is the default (30s): their heartbeat comes
	// every 10s, so no refresh of theirs hands them the holder's expired
	// permits before the holder's own Release does.
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: permits, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	warm(t, pool, permits+1)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "PGSOURCE_TEST_PREFIX="+prefix, "PGSOURCE_TEST_APP="+name,
		"PGSOURCE_TEST_LEASE="+lease.String(), testenv.RedisURLVar+"="+testenv.RedisURL(t),
		testenv.DatabaseURLVar+"="+testenv.DatabaseURL(t))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	a := watchActivity(t, name)
	a.waitActive(t, permits, "the holder process's queries")
	others, stopOthers := context.WithCancel(context.Background())
	defer stopOthers()
	waiters := longQueries(others, pool, sem, permits+1)
	waitQueued(t, sem, permits+1)

	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Redis lets the holder's permits expire: their lease deadlines (ms,
	// on Redis's clock) pass. Nothing purges them meanwhile (Stats
	// would, and hand them to the waiters).
	holders := prefix + ":{db}:holders"
	testenv.WaitFor(t, 5*time.Second, "the holder's leases to run out", func() bool {
		now, err := rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		live, err := rdb.ZCount(context.Background(), holders, "("+strconv.FormatInt(now.UnixMilli(), 10), "+inf").Result()
		if err != nil {
			t.Fatal(err)
		}
		return live == 0
	})
	if n := rdb.ZCard(context.Background(), holders).Val(); n != permits {
		t.Fatalf("%d holders in %s, want the holder's %d: the test reads the wrong key", n, holders, permits)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for range permits {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the holder process exited before all its queries returned")
			}
			if !strings.HasPrefix(line, "done ") || !strings.Contains(line, semaphore.ErrLeaseLost.Error()) {
				t.Errorf("the resumed holder's Exec: %q, want an error saying %q", line, semaphore.ErrLeaseLost)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the resumed holder's queries did not return")
		}
	}
	a.waitActive(t, permits, "the waiters' queries, once the holder lost its permits")
	a.sampleMore(t, 5) // a late end of a cancelled query would show now
	stopOthers()
	waiters()
	if most := a.close(); most > permits {
		t.Errorf("Postgres ran %d of these queries at once with %d permits", most, permits)
	}
	nothingLeft(t, a, sem)
}
