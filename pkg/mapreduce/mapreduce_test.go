package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

func TestRunReducesEveryPageExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", cnt, e.opts(mapreduce.JobOptions{}))))
	c := e.client()
	e.worker(c, 4)
	e.worker(e.client(), 4) // a second worker process, in effect

	id := mustStart(t, c, "sum", sumArgs{N: 1000, PageSize: 7}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("state %s, error %q", st.State, st.Error)
	}
	if got, want := resultOf(t, c, st), 1000*999/2; got != want {
		t.Errorf("result %d, want %d", got, want)
	}
	pages := (1000 + 6) / 7
	if st.Total != pages || st.Done != pages || st.Failed != 0 {
		t.Errorf("total %d done %d failed %d, want %d pages done", st.Total, st.Done, st.Failed, pages)
	}
	if st.Created.IsZero() || st.SplitDone.Before(st.Created) || st.Finished.Before(st.SplitDone) {
		t.Errorf("timestamps out of order: %+v", st)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	if cnt.reduces != 1 || len(cnt.reduced) != pages {
		t.Errorf("Reduce ran %d times over %d pages, want once over %d", cnt.reduces, len(cnt.reduced), pages)
	}
	for i, pr := range cnt.reduced {
		if pr.Index != i {
			t.Fatalf("Reduce saw page %d at position %d: pages must come in split order", pr.Index, i)
		}
	}
	for lo, n := range cnt.maps {
		if n != 1 {
			t.Errorf("page at %d mapped %d times in a run without failures", lo, n)
		}
	}
}

// A page delivered twice — concurrently, and again afterwards — is recorded
// once: its count and the result do not change.
func TestDuplicateDeliveryOfAPageRecordsItOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	j := sumJob("sum", cnt, e.opts(mapreduce.JobOptions{}))
	// Both concurrent deliveries of page 0 are inside Map at once: neither
	// can have seen the other's record.
	var inside sync.WaitGroup
	inside.Add(2)
	j.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mapped(p.Lo)
		cnt.mu.Lock()
		n := cnt.maps[p.Lo]
		cnt.mu.Unlock()
		if p.Lo == 0 && n <= 2 {
			inside.Done()
			inside.Wait()
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c := e.client()
	ctx := context.Background()

	id := mustStart(t, c, "sum", sumArgs{N: 30, PageSize: 10}, mapreduce.StartOptions{})
	// No worker yet: run the split by hand, then deliver page 0 three times.
	splits := e.pendingTasks(mapreduce.TypeSplit)
	if len(splits) != 1 {
		t.Fatalf("%d split tasks, want 1", len(splits))
	}
	if err := c.ProcessTask(ctx, task(splits[0])); err != nil {
		t.Fatal(err)
	}
	maps := e.pendingTasks(mapreduce.TypeMap)
	if len(maps) != 3 {
		t.Fatalf("%d map tasks, want 3", len(maps))
	}
	var page0 *asynq.TaskInfo
	for _, ti := range maps {
		if strings.HasSuffix(ti.ID, ":map:0") {
			page0 = ti
		}
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.ProcessTask(ctx, task(page0)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := c.ProcessTask(ctx, task(page0)); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Done != 1 {
		t.Fatalf("page 0 delivered 3 times: done = %d, want 1", st.Done)
	}
	// Now the real worker runs every queued task, page 0 included again.
	e.worker(c, 4)
	st = wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 3 {
		t.Fatalf("state %s done %d (error %q), want succeeded with 3", st.State, st.Done, st.Error)
	}
	if got := resultOf(t, c, st); got != 30*29/2 {
		t.Errorf("result %d, want %d", got, 30*29/2)
	}
}

// Pages that finish while the split is still emitting must not trigger the
// reduce: the total is unknown until the split ends. The split here waits
// for each page to be recorded before emitting the next, so that every
// page but the last is recorded mid-split — the race made certain.
func TestPagesRecordedDuringTheSplitNeverTriggerAnEarlyReduce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.client()
	var reduces []int // number of pages each Reduce saw
	var mu sync.Mutex
	const n = 4
	e.addJob(mapreduce.AddJob(e.jobs, mapreduce.Job[struct{}, int, int, int]{
		Name: "slow-split",
		Split: func(ctx context.Context, _ struct{}, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
				id, ok := mapreduce.RunID(ctx)
				if !ok {
					return errors.New("no run ID in Split's context")
				}
				var stErr error
				recorded := testenv.Eventually(10*time.Second, func() bool {
					st, err := c.Status(ctx, id)
					switch {
					case err != nil:
						stErr = err
					case st.State != mapreduce.StateSplitting:
						stErr = fmt.Errorf("state %s while the split is still emitting", st.State)
					}
					return stErr != nil || st.Done == i+1
				})
				if stErr != nil {
					return stErr
				}
				if !recorded {
					return fmt.Errorf("page %d was not recorded within 10s", i)
				}
			}
			return nil
		},
		Map: func(ctx context.Context, p int) (int, error) {
			if i, ok := mapreduce.PageIndex(ctx); !ok || i != p {
				return 0, fmt.Errorf("PageIndex = %d, %v in the Map of page %d", i, ok, p)
			}
			return p, nil
		},
		Reduce: func(ctx context.Context, _ struct{}, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			seen := 0
			for _, err := range pages {
				if err != nil {
					return 0, err
				}
				seen++
			}
			mu.Lock()
			reduces = append(reduces, seen)
			mu.Unlock()
			return seen, nil
		},
		Options: e.opts(mapreduce.JobOptions{StepRetries: -1}),
	}))
	e.worker(c, 4)
	id := mustStart(t, c, "slow-split", nil, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("state %s, error %q", st.State, st.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reduces) != 1 || reduces[0] != n {
		t.Fatalf("Reduce calls saw %v pages, want one call seeing %d", reduces, n)
	}
}

// failingJob fails the pages whose Lo is in bad, every time.
func failingJob(name string, cnt *counts, bad map[int]bool, o mapreduce.JobOptions) mapreduce.Job[sumArgs, span, int, int] {
	j := sumJob(name, cnt, o)
	j.Map = func(ctx context.Context, p span) (int, error) {
		cnt.mapped(p.Lo)
		if bad[p.Lo] {
			return 0, fmt.Errorf("page at %d is cursed", p.Lo)
		}
		return sumSpan(p), nil
	}
	return j
}

func TestFailedPageIsReportedToReduceUnderCompleteSemantics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	e.addJob(mapreduce.AddJob(e.jobs, failingJob("partial", cnt, map[int]bool{20: true},
		e.opts(mapreduce.JobOptions{Semantics: mapreduce.CompleteSemantics, MapRetries: 2}))))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "partial", sumArgs{N: 50, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 4 || st.Failed != 1 {
		t.Fatalf("state %s done %d failed %d (error %q), want succeeded, 4 done, 1 failed", st.State, st.Done, st.Failed, st.Error)
	}
	if got, want := resultOf(t, c, st), 50*49/2-sumSpan(span{20, 30}); got != want {
		t.Errorf("result %d, want %d (every page but the failed one)", got, want)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	if cnt.maps[20] != 3 {
		t.Errorf("the failing page ran %d times, want 1 + 2 retries", cnt.maps[20])
	}
	var failed []mapreduce.PageResult[span, int]
	for _, pr := range cnt.reduced {
		if pr.Err != nil {
			failed = append(failed, pr)
		}
	}
	if len(failed) != 1 || failed[0].Index != 2 || failed[0].Page != (span{20, 30}) || !strings.Contains(failed[0].Err.Error(), "cursed") {
		t.Fatalf("Reduce saw failures %+v, want page 2 {20 30} with its error", failed)
	}
	// The run succeeded with a failed page: Retry says why it will not run
	// that page again, and what to do instead.
	err := c.Retry(context.Background(), id)
	if !errors.Is(err, mapreduce.ErrRunSucceeded) || !strings.Contains(err.Error(), "1 failed pages") ||
		!strings.Contains(err.Error(), "CompleteSemantics") || !strings.Contains(err.Error(), "have Reduce return an error") {
		t.Errorf("Retry of a run that succeeded with a failed page: %v; want ErrRunSucceeded naming the failed page, the semantics and the fix", err)
	}
}

func TestFailedPagesFailTheRunUnderSuccessSemantics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	e.addJob(mapreduce.AddJob(e.jobs, failingJob("strict", cnt, map[int]bool{10: true, 30: true},
		e.opts(mapreduce.JobOptions{MapRetries: -1}))))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "strict", sumArgs{N: 50, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateFailed || st.Failed != 2 || st.Done != 3 {
		t.Fatalf("state %s done %d failed %d, want failed with 2 failed pages", st.State, st.Done, st.Failed)
	}
	for _, want := range []string{"2 of 5 pages failed", "page 1:", "page 3:", "cursed"} {
		if !strings.Contains(st.Error, want) {
			t.Errorf("error %q does not name %q", st.Error, want)
		}
	}
	if _, reduces := cnt.snapshot(); reduces != 0 {
		t.Errorf("Reduce ran %d times under SuccessSemantics with failed pages", reduces)
	}
	if st.Result != nil {
		t.Errorf("a failed run has a result: %s", st.Result)
	}
}

func TestMapErrorsAreRetriedBeforeAPageFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	var mu sync.Mutex
	attempts := map[int]int{}
	var backoffMu sync.Mutex
	var backoffs []int // the retry numbers the job's Backoff was asked about
	j := sumJob("flaky", cnt, e.opts(mapreduce.JobOptions{MapRetries: 3, Backoff: func(n int, err error) time.Duration {
		backoffMu.Lock()
		backoffs = append(backoffs, n)
		backoffMu.Unlock()
		return 20 * time.Millisecond
	}}))
	j.Map = func(ctx context.Context, p span) (int, error) {
		mu.Lock()
		attempts[p.Lo]++
		n := attempts[p.Lo]
		mu.Unlock()
		if n < 3 {
			return 0, errors.New("transient")
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "flaky", sumArgs{N: 40, PageSize: 10}, mapreduce.StartOptions{})
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded || resultOf(t, c, st) != 40*39/2 {
		t.Fatalf("state %s (error %q), want succeeded with the full sum", st.State, st.Error)
	}
	// Four pages failed twice each: the job's own Backoff timed 8 retries,
	// asked about retries 0 and 1 of each page.
	backoffMu.Lock()
	defer backoffMu.Unlock()
	slices.Sort(backoffs)
	if want := []int{0, 0, 0, 0, 1, 1, 1, 1}; !slices.Equal(backoffs, want) {
		t.Errorf("Backoff was asked about retries %v, want %v", backoffs, want)
	}
}
