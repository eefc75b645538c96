package mapreduce_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// A reduce reads the pages' results and failure records in reads of a
// bounded number of bytes: with pages of 100 KiB and a bound of 250 KiB,
// no read of the results or failures hash names more than two of them, and
// Reduce still sees every page in order, small results (bundled), large
// ones and failures alike.
func TestAReduceReadsPagesInBatchesBoundedByBytes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const pages, big = 20, 100 << 10
	job := mapreduce.Job[int, int, string, string]{
		Name: "wide",
		Split: func(_ context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(_ context.Context, i int) (string, error) {
			switch i {
			case 5:
				return "s", nil
			case 7:
				return "", errors.New(strings.Repeat("e", big))
			}
			return strings.Repeat("x", big), nil
		},
		Reduce: func(_ context.Context, _ int, in iter.Seq2[mapreduce.PageResult[int, string], error]) (string, error) {
			var seen []string
			for p, err := range in {
				if err != nil {
					return "", err
				}
				seen = append(seen, fmt.Sprintf("%d:%d:%v", p.Index, len(p.Result), p.Err != nil))
			}
			return strings.Join(seen, " "), nil
		},
		Options: e.opts(mapreduce.JobOptions{MapRetries: -1, Semantics: mapreduce.CompleteSemantics}),
	}
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	c.SetReduceReadBytes(250 << 10)
	stop := e.monitorReads()
	e.worker(c, 4)
	id, err := job.Start(context.Background(), c, pages, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 60*time.Second)
	cmds := stop()
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("the run %s: %s", st.State, st.Error)
	}
	var want []string
	for i := range pages {
		switch i {
		case 5:
			want = append(want, fmt.Sprintf("%d:%d:false", i, len(`"s"`)-2))
		case 7:
			want = append(want, fmt.Sprintf("%d:0:true", i))
		default:
			want = append(want, fmt.Sprintf("%d:%d:false", i, big))
		}
	}
	if got, _ := job.Result(st); got != strings.Join(want, " ") {
		t.Errorf("Reduce saw:\n%s\nwant:\n%s", got, strings.Join(want, " "))
	}
	reads := 0
	for _, words := range cmds {
		if len(words) < 2 || strings.ToUpper(words[0]) != "HMGET" ||
			!(strings.Contains(words[1], "}:results:") || strings.Contains(words[1], "}:failures:")) {
			continue
		}
		reads++
		n := 0 // pages of 100 KiB: page 7's failure record is cut to 4 KiB
		for _, f := range words[2:] {
			if i, err := strconv.Atoi(f); err == nil && i != 7 {
				n++
			}
		}
		if n > 2 {
			t.Errorf("one read names %d pages of 100 KiB, over the bound of 250 KiB: %q", n, words)
		}
	}
	if reads < pages/2 {
		t.Errorf("%d reads of the results and failures, want at least %d: two pages of 100 KiB at a time", reads, pages/2)
	}
}
