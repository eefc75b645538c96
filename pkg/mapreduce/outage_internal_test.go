package mapreduce

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

type sqlError struct{ code string }

func (e *sqlError) Error() string    { return "SQLSTATE " + e.code }
func (e *sqlError) SQLState() string { return e.code }

type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// A step's failed attempt is an outage's when Postgres or Redis caused
// it; the step's own errors, also those it marks transient, are not.
func TestOutageOfTellsAnOutagesFailuresFromAStepsOwn(t *testing.T) {
	t.Parallel()
	pg := func(err error) error { return outage.Mark(err, outage.Database) } // as pgsource returns its errors
	for _, c := range []struct {
		err  error
		want outage.Cause
	}{
		{fmt.Errorf("page 3: %w", &sqlError{"08006"}), outage.Database},
		{&sqlError{"57P01"}, outage.Database},
		{pg(io.ErrUnexpectedEOF), outage.Database}, // a connection broken mid-query
		{replyError("READONLY You can't write against a read only replica."), outage.RedisFailover},
		{&sqlError{"40001"}, ""},    // a serialization failure: the step's to retry
		{&sqlError{"23505"}, ""},    // a constraint: not transient at all
		{io.ErrUnexpectedEOF, ""},   // some server's, unknown which
		{Transient(pg(io.EOF)), ""}, // the job says it is its own
		{errors.New("row 7 is malformed"), ""},
		{pg(fmt.Errorf("query: %w", semaphore.ErrLeaseLost)), ""}, // the semaphore logs it
	} {
		if got := outageOf(c.err); got != c.want {
			t.Errorf("outageOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
