package mapreduce_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

func TestFailuresListsAFailedRunsPagesByIndexWithTheirErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, failingJob("listed", newCounts(), map[int]bool{10: true, 30: true},
		e.opts(mapreduce.JobOptions{MapRetries: -1}))))
	c := e.client()
	e.worker(c, 4)
	id := mustStart(t, c, "listed", sumArgs{N: 50, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateFailed {
		t.Fatalf("the run %s, want failed", st.State)
	}
	ctx := context.Background()
	all, total, err := c.Failures(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if total != 2 || len(all) != 2 || all[0].Index != 1 || all[1].Index != 3 {
		t.Fatalf("Failures: %+v (total %d), want pages 1 and 3", all, total)
	}
	if !strings.Contains(all[0].Error, "page at 10 is cursed") || !strings.Contains(string(all[0].Page), "10") {
		t.Errorf("page 1's failure %+v: want its descriptor and its error", all[0])
	}
	// The mark that tells asynq not to retry is asynq's business, not the
	// reader's: Reduce and Failures show Map's error as it returned it.
	if strings.Contains(all[0].Error, "skip retry") {
		t.Errorf("page 1's failure reads %q: want Map's error without asynq's marker", all[0].Error)
	}
	first, total, err := c.Failures(ctx, id, 1)
	if err != nil || len(first) != 1 || first[0].Index != 1 || total != 2 {
		t.Errorf("Failures with max 1: %+v (total %d, %v), want page 1 of 2", first, total, err)
	}
	if _, _, err := c.Failures(ctx, "listed:nosuch", 0); !errors.Is(err, mapreduce.ErrRunNotFound) {
		t.Errorf("Failures of an unknown run: %v, want ErrRunNotFound", err)
	}
}
