package semaphore_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

var ceiling = strconv.Itoa(semaphore.MaxLimit)

func TestLimitsAboveMaxLimitAreRefusedWithAnErrorNamingTheCeiling(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()

	_, err := semaphore.New(rdb, "db", semaphore.Options{Limit: semaphore.MaxLimit + 1, Prefix: prefix})
	if err == nil || !strings.Contains(err.Error(), ceiling) {
		t.Errorf("New with Limit MaxLimit+1 = %v, want an error naming %s", err, ceiling)
	}
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 4})
	if err := mustAcquire(t, s).Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{semaphore.MaxLimit + 1, math.MaxInt64} {
		if err := s.SetLimit(ctx, n); err == nil || !strings.Contains(err.Error(), ceiling) {
			t.Errorf("SetLimit(%d) = %v, want an error naming %s", n, err, ceiling)
		}
	}
	// The script refuses on its own what Go would have refused.
	for _, n := range []string{"9223372036854775807", strconv.Itoa(semaphore.MaxLimit + 1), "0", "-1", "2.5", "many"} {
		if err := s.SetLimitInRedis(ctx, n); err == nil || !strings.Contains(err.Error(), "from 1 to "+ceiling) {
			t.Errorf("the set-limit script with %q = %v, want an error naming %s", n, err, ceiling)
		}
	}
	if st := stats(t, s); st.Limit != 4 {
		t.Errorf("after the refused limits, limit = %d, want 4 unchanged", st.Limit)
	}
	if _, err := s.AcquireN(ctx, semaphore.MaxLimit+1); !errors.Is(err, semaphore.ErrExceedsLimit) || !strings.Contains(err.Error(), ceiling) {
		t.Errorf("AcquireN(MaxLimit+1) = %v, want ErrExceedsLimit naming %s", err, ceiling)
	}

	// The ceiling itself is a limit like any other.
	if err := s.SetLimit(ctx, semaphore.MaxLimit); err != nil {
		t.Fatal(err)
	}
	p, err := s.AcquireN(ctx, semaphore.MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st.Limit != semaphore.MaxLimit || st.Held != semaphore.MaxLimit {
		t.Errorf("holding MaxLimit: limit %d, held %d, want both %d", st.Limit, st.Held, semaphore.MaxLimit)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTheScriptsRefuseAConfiguredLimitAboveMaxLimit(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := newSem(t, rdb, prefix, semaphore.Options{Limit: 1})
	s.ConfigureLimit(math.MaxInt64)
	if _, err := s.Acquire(context.Background()); err == nil || !strings.Contains(err.Error(), ceiling) {
		t.Errorf("Acquire with a configured limit of MaxInt64 = %v, want an error naming %s", err, ceiling)
	}
	if _, ok, err := s.Limit(context.Background()); err != nil || ok {
		t.Errorf("after the refusal, Limit says ok=%v err=%v, want no limit written", ok, err)
	}
}
