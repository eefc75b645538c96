package schedules_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/internal/tests/testenv"
)

func TestListMergesReplicasAndDropsProcessesPastTheirTTL(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	next := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	same := []schedules.Schedule{{Job: "b", Spec: "@hourly", Next: next}, {Job: "a", Spec: "@every 1m", Next: next}}
	for _, p := range []string{"one", "two"} {
		if err := schedules.Publish(ctx, rdb, prefix, p, time.Minute, same); err != nil {
			t.Fatal(err)
		}
	}
	if err := schedules.Publish(ctx, rdb, prefix, "gone", time.Millisecond, []schedules.Schedule{{Job: "c", Spec: "@daily", Next: next}}); err != nil {
		t.Fatal(err)
	}
	// c's process expires a millisecond after it published.
	var list []schedules.Schedule
	testenv.Eventually(time.Second, func() bool {
		var err error
		if list, err = schedules.List(ctx, rdb, prefix); err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(list, func(s schedules.Schedule) bool { return s.Job == "c" })
	}) // a list that kept c fails below
	if len(list) != 2 || list[0].Job != "a" || list[1].Job != "b" || !list[0].Next.Equal(next) {
		t.Fatalf("List: %+v, want a's and b's schedules once each, sorted, without the expired c", list)
	}
	if n, _ := rdb.HLen(ctx, prefix+":{catalog}:schedules").Result(); n != 2 {
		t.Errorf("the expired process's entry was not deleted: %d entries", n)
	}
	if err := schedules.Withdraw(ctx, rdb, prefix, "one"); err != nil {
		t.Fatal(err)
	}
	if err := schedules.Withdraw(ctx, rdb, prefix, "two"); err != nil {
		t.Fatal(err)
	}
	if list, _ := schedules.List(ctx, rdb, prefix); len(list) != 0 {
		t.Errorf("after both withdrew: %+v", list)
	}
}
