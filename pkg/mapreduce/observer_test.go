package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// stepLog records what a Client tells its Observer.
type stepLog struct {
	mu    sync.Mutex
	steps []stepDone
	ended []runEnded
}

type stepDone struct {
	mapreduce.Step
	err error
}

type runEnded struct {
	job, run string
	state    mapreduce.State
	took     time.Duration
}

type stepKey struct{}

func (l *stepLog) Step(ctx context.Context, s mapreduce.Step) (context.Context, func(error)) {
	return context.WithValue(ctx, stepKey{}, s), func(err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.steps = append(l.steps, stepDone{s, err})
	}
}

func (l *stepLog) RunEnded(job, run string, state mapreduce.State, took time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = append(l.ended, runEnded{job, run, state, took})
}

// An Observer sees every attempt of every step that starts work, with its
// run, page and attempt, each once with its outcome; the functions run
// with the context it returned; and the run's end is reported once.
func TestObserverSeesEveryStepAttemptWithItsOutcomeAndTheRunsEndOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages = 5
	calls := map[int]int{}
	var mu sync.Mutex
	j := sumJob("observed", newCounts(), e.opts(mapreduce.JobOptions{MapRetries: 2}))
	j.Map = func(ctx context.Context, p span) (int, error) {
		s, _ := ctx.Value(stepKey{}).(mapreduce.Step)
		if s.Kind != mapreduce.StepMap || s.Page != p.Lo/10 {
			return 0, errors.New("Map did not run with the context the Observer returned for its page")
		}
		mu.Lock()
		calls[p.Lo]++
		n := calls[p.Lo]
		mu.Unlock()
		if n == 1 {
			return 0, errors.New("first attempt fails")
		}
		return sumSpan(p), nil
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	log := &stepLog{}
	c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, Observer: log})
	if err != nil {
		t.Fatal(err)
	}
	e.worker(c, 4)
	id := mustStart(t, c, "observed", sumArgs{N: pages * 10, PageSize: 10}, mapreduce.StartOptions{})
	if st := wait(t, c, id, 30*time.Second); st.State != mapreduce.StateSucceeded {
		t.Fatalf("run ended %s (%s), want succeeded", st.State, st.Error)
	}
	testenv.WaitFor(t, 5*time.Second, "the reduce step's outcome", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return slices.ContainsFunc(log.steps, func(s stepDone) bool { return s.Kind == mapreduce.StepReduce })
	})
	log.mu.Lock()
	defer log.mu.Unlock()
	attempts := map[int][]int{} // page -> attempts that failed (1) or succeeded (-n)
	var splits, reduces int
	for _, s := range log.steps {
		if s.Job != "observed" || s.Run != id || s.TaskID == "" || s.Attempt < 1 {
			t.Errorf("step %+v lacks its job, run, task or attempt", s.Step)
		}
		switch s.Kind {
		case mapreduce.StepSplit:
			splits++
			if s.err != nil || s.Page != -1 {
				t.Errorf("split observed as %+v, %v", s.Step, s.err)
			}
		case mapreduce.StepReduce:
			reduces++
			if s.err != nil || s.Page != -1 {
				t.Errorf("reduce observed as %+v, %v", s.Step, s.err)
			}
		case mapreduce.StepMap:
			a := s.Attempt
			if s.err == nil {
				a = -a
			}
			attempts[s.Page] = append(attempts[s.Page], a)
		}
	}
	if splits != 1 || reduces != 1 {
		t.Errorf("observed %d splits and %d reduces, want 1 each", splits, reduces)
	}
	for page := range pages {
		if got := attempts[page]; !slices.Equal(got, []int{1, -2}) {
			t.Errorf("page %d: attempts observed %v, want [1 -2]: attempt 1 failed, attempt 2 succeeded", page, got)
		}
	}
	if len(log.ended) != 1 || log.ended[0].run != id || log.ended[0].job != "observed" ||
		log.ended[0].state != mapreduce.StateSucceeded || log.ended[0].took <= 0 {
		t.Errorf("RunEnded calls %+v, want one for %s, succeeded, with its duration", log.ended, id)
	}
}

// A step whose run is cancelled while it works ends with ErrRunCancelled,
// and the Client that cancelled the run reports its end.
func TestObserverSeesAStepCutShortByCancelEndWithErrRunCancelled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	started := make(chan struct{}, 1)
	j := sumJob("cut", newCounts(), e.opts(mapreduce.JobOptions{}))
	j.Map = func(ctx context.Context, p span) (int, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return 0, context.Cause(ctx)
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	log := &stepLog{}
	c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, Observer: log, CancelPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.worker(c, 1)
	id := mustStart(t, c, "cut", sumArgs{N: 10, PageSize: 10}, mapreduce.StartOptions{})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the page never started")
	}
	if err := c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the page's outcome", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return slices.ContainsFunc(log.steps, func(s stepDone) bool { return s.Kind == mapreduce.StepMap })
	})
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, s := range log.steps {
		if s.Kind == mapreduce.StepMap && !errors.Is(s.err, mapreduce.ErrRunCancelled) {
			t.Errorf("the cancelled page ended with %v, want ErrRunCancelled", s.err)
		}
	}
	if len(log.ended) != 1 || log.ended[0].state != mapreduce.StateCancelled {
		t.Errorf("RunEnded calls %+v, want one, cancelled", log.ended)
	}
}

// recordingObserver notes the order in which it sees steps start and end.
type recordingObserver struct {
	name string
	log  *[]string
}

type obsKey string

func (r recordingObserver) Step(ctx context.Context, s mapreduce.Step) (context.Context, func(error)) {
	*r.log = append(*r.log, r.name+" starts, after "+fmt.Sprint(ctx.Value(obsKey("last"))))
	return context.WithValue(ctx, obsKey("last"), r.name), func(err error) { *r.log = append(*r.log, r.name+" ends: "+fmt.Sprint(err)) }
}

func (r recordingObserver) RunEnded(job, run string, state mapreduce.State, took time.Duration) {
	*r.log = append(*r.log, r.name+" "+string(state))
}

// Observers nests its observers as spans nest: each sees the context the
// one before returned, and they end in the reverse order.
func TestObserversNestTheirStepsAndEndThemInReverse(t *testing.T) {
	if mapreduce.Observers() != nil || mapreduce.Observers(nil, nil) != nil {
		t.Error("Observers of none is not nil")
	}
	var log []string
	a, b := recordingObserver{"a", &log}, recordingObserver{"b", &log}
	if got := mapreduce.Observers(nil, a); got != mapreduce.Observer(a) {
		t.Errorf("Observers of one = %v, want that one", got)
	}
	o := mapreduce.Observers(a, nil, b)
	ctx, end := o.Step(context.Background(), mapreduce.Step{Kind: mapreduce.StepMap})
	end(errors.New("boom"))
	o.RunEnded("j", "j:1", mapreduce.StateSucceeded, time.Second)
	want := []string{"a starts, after <nil>", "b starts, after a", "b ends: boom", "a ends: boom", "a succeeded", "b succeeded"}
	if fmt.Sprint(log) != fmt.Sprint(want) || ctx.Value(obsKey("last")) != "b" {
		t.Errorf("calls %q (step context from %v), want %q (from b)", log, ctx.Value(obsKey("last")), want)
	}
}

// A Map that panics fails its attempt like a Map that returns an error:
// retried, recorded as failed on its last attempt with where it panicked,
// and observed as a failure, not a success.
func TestAPanickingMapFailsItsPageLikeAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cnt := newCounts()
	j := sumJob("panics", cnt, e.opts(mapreduce.JobOptions{Semantics: mapreduce.CompleteSemantics, MapRetries: 1}))
	inner := j.Map
	j.Map = func(ctx context.Context, p span) (int, error) {
		if p.Lo == 5 {
			panic("page 5 has no customer")
		}
		return inner(ctx, p)
	}
	e.addJob(mapreduce.AddJob(e.jobs, j))
	obs := &stepLog{}
	c, err := mapreduce.New(e.rdb, mapreduce.Config{Jobs: e.jobs, Prefix: e.prefix, Observer: obs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.worker(c, 2)
	id := mustStart(t, c, "panics", sumArgs{N: 20, PageSize: 5}, mapreduce.StartOptions{})
	st := wait(t, c, id, 20*time.Second)
	if st.State != mapreduce.StateSucceeded || st.Done != 3 || st.Failed != 1 {
		t.Fatalf("state %s, done %d, failed %d (%s); want succeeded with one page failed", st.State, st.Done, st.Failed, st.Error)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	for _, pr := range cnt.reduced {
		if pr.Index == 1 && (pr.Err == nil || !strings.Contains(pr.Err.Error(), "Map panicked at observer_test.go:") || !strings.Contains(pr.Err.Error(), "page 5 has no customer")) {
			t.Errorf("page 1's failure: %v, want Map panicked at observer_test.go:N with the panic's message", pr.Err)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	ok, failed := 0, 0
	for _, s := range obs.steps {
		var pe *mapreduce.PanicError
		switch {
		case s.Kind != mapreduce.StepMap:
		case s.err == nil:
			ok++
		case errors.As(s.err, &pe) && s.Page == 1:
			failed++
		}
	}
	if failed != 2 || ok != 3 {
		t.Errorf("the observer saw %d map attempts succeed and %d fail, want 3 and 2 (the panicking page's two attempts)", ok, failed)
	}
}
