package mapreduce

import (
	"context"
	"fmt"
)

// What a run keeps in Redis is bounded: its arguments (JobOptions.MaxArgsBytes),
// each page's result and the run's result (maxResultBytes), its errors
// (errorMax), so that neither Redis's memory nor a reader of the run is at
// the mercy of one large value.
const (
	// DefaultMaxArgsBytes is JobOptions.MaxArgsBytes's default: 1 MiB.
	DefaultMaxArgsBytes = 1 << 20
	// maxArgsBytes is the most JobOptions.MaxArgsBytes may be: as much as
	// a page's result may take.
	maxArgsBytes = maxResultBytes
	// errorMax is how much of an error a run keeps: its own (Status.Error)
	// and each failed page's (PageFailure.Error). Lists of runs and of
	// failed pages read them.
	errorMax = 4 << 10
)

// mib formats n bytes in MiB, for messages.
func mib(n int) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// checkArgsSize returns the error of encoded arguments of n bytes for a
// job whose options are o (defaults applied), or nil.
func checkArgsSize(o JobOptions, n int) error {
	if n <= o.MaxArgsBytes {
		return nil
	}
	return fmt.Errorf("%w: the arguments are %d bytes encoded (%s), over the job's JobOptions.MaxArgsBytes of %d (%s): "+
		"every run keeps its arguments in Redis until its retention ends; pass a reference to large input (a table, object storage), "+
		"or raise MaxArgsBytes in the job's options (up to %s)", ErrInvalidArgs, n, mib(n), o.MaxArgsBytes, mib(o.MaxArgsBytes), mib(maxArgsBytes))
}

// checkRunResultSize returns the error of a run whose Reduce returned n
// bytes encoded, or nil, warning of a large one as checkResultSize does:
// the run's result stays in its record until the retention ends.
func (c *Client) checkRunResultSize(ctx context.Context, n int) error {
	if n > maxResultBytes {
		return &malformedError{fmt.Errorf("the result of Reduce is %s encoded, over the %s a run's result may take in Redis, where it stays until the run's retention ends: "+
			"write large output to a store of your own (a table, object storage) and return a reference to it", mib(n), mib(maxResultBytes))}
	}
	if n > warnResultBytes && onceAMinute(&c.bigResultWarned) {
		Logger(ctx).Warn("mapreduce: the run's result is large: Redis keeps it until the run's retention ends; "+
			"write large output to a store of your own and return a reference to it", "result_bytes", n)
	}
	return nil
}
