package main

import (
	"strings"
	"testing"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

func TestTheHintOfARunFailedByItsArgumentsIsANewRunWithArgumentsToEdit(t *testing.T) {
	refused := func(args string) *mapreduce.Status {
		return &mapreduce.Status{ID: "sum:1", Job: "sum", State: mapreduce.StateFailed, Args: []byte(args),
			Error: `mapreduce: split of sum:1: invalid arguments for job "sum": page_size 0: use at least 1`}
	}
	for _, tc := range []struct{ args, want string }{
		{`{"note":"it's"}`, `fix them in a new run: scheduler run sum --args '{"note":"it'\''s"}'`},
		{`null`, `it ran with no arguments, which its job refused: give them in a new run: scheduler run sum --args JSON`},
		{"\x01binary", `start a new run with other arguments (from Go, Job.Start)`},
	} {
		if got := retryHint(refused(tc.args)); !strings.Contains(got, tc.want) || strings.Contains(got, "scheduler retry") {
			t.Errorf("retryHint of a run refused its arguments %q: %q, want %q and no retry", tc.args, got, tc.want)
		}
	}
	failed := &mapreduce.Status{ID: "sum:2", Job: "sum", State: mapreduce.StateFailed, Args: []byte(`{}`),
		Error: `mapreduce: split of sum:2 after 0 pages: connection refused`}
	if got := retryHint(failed); !strings.Contains(got, "scheduler retry sum:2") {
		t.Errorf("retryHint of a run whose split failed otherwise: %q, want a retry", got)
	}
}
