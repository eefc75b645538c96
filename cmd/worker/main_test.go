package main_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// SIGTERM mid-run: the worker stops taking pages, lets its in-flight ones
// finish, gives its permits back (not after their leases: at once) and
// exits 0; another worker finishes the run with the right report.
func TestSIGTERMFinishesInFlightPagesReleasesPermitsAndExitsZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, ordersreport.Name)
	if err := ordersreport.Seed(ctx, pool, 20_000); err != nil {
		t.Fatal(err)
	}
	bin := testenv.Build(t, ".")
	dbURL := testenv.DatabaseURLIn(t, schema)
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "--db-permits", "2", "--concurrency", "4", "--shutdown-timeout", "20s",
			"--poll-interval", "20ms", "--log-format", "json")
		cmd.Env = append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t), "DATABASE_URL="+dbURL,
			"BATCHMR_PREFIX="+prefix)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 2, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()

	first := start()
	id, err := ordersreport.Job.Start(ctx, mr, ordersreport.Args{PageSize: 1000, SlowMS: 300}, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := sem.Stats(ctx)
		run, _ := mr.Status(ctx, id)
		if st.Held == 2 && run != nil && run.Done >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not get going: %+v %+v", st, run)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- first.Wait() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("worker after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not exit within its shutdown timeout")
	}
	if st, err := sem.Stats(ctx); err != nil || st.Held != 0 {
		t.Fatalf("permits after a clean exit: %+v, %v; want none held (not left to their leases)", st, err)
	}
	if st, _ := mr.Status(ctx, id); st.State.Ended() || st.Done == 20 {
		t.Fatalf("the run ended with the first worker: %+v; the test needs pages left", st)
	}

	start()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := mr.Wait(wctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ordersreport.Job.Result(st)
	if err != nil {
		t.Fatalf("run: %s (%s)", st.State, st.Error)
	}
	want, err := ordersreport.Expected(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Totals.Equal(want) || rep.Pages != 20 {
		t.Errorf("report %+v over %d pages, want %+v over 20", rep.Totals, rep.Pages, want)
	}
}
