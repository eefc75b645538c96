package mapreduce

import "context"

type ctxKey int

const (
	runIDKey ctxKey = iota
	pageIndexKey
)

// RunID returns the ID of the run whose Split, Map or Reduce is running
// with ctx. Use it, with PageIndex, to make the effects of a Map idempotent:
// "run ID, page index" names one page's work across every retry.
func RunID(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(runIDKey).(string)
	return id, ok
}

// PageIndex returns the index of the page a Map is processing, from 0 in
// split order.
func PageIndex(ctx context.Context) (int, bool) {
	i, ok := ctx.Value(pageIndexKey).(int)
	return i, ok
}
