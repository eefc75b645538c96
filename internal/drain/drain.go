// Package drain follows one piece of work (a task) through a semaphore's
// Drain. The task that runs the work puts a Notice in its context (With);
// the semaphore's Acquire, under that context, is refused by Drain only
// while the work has held no permit (Held), and notes a refusal
// (Drained), which the task reads however the work's code wrapped or
// replaced the error: work that never began is handed back whole, work
// that began goes on to its end.
package drain

import (
	"context"
	"sync/atomic"
)

// Notice is one piece of work's record of its permits.
type Notice struct {
	Held    atomic.Bool // an Acquire under it was granted
	Drained atomic.Bool // an Acquire under it was refused by Drain
}

type key struct{}

// With returns a copy of ctx that carries a new Notice.
func With(ctx context.Context) context.Context {
	return context.WithValue(ctx, key{}, &Notice{})
}

// From returns ctx's Notice, or nil if it carries none.
func From(ctx context.Context) *Notice {
	n, _ := ctx.Value(key{}).(*Notice)
	return n
}

// Refused reports whether an Acquire under ctx was refused by Drain.
func Refused(ctx context.Context) bool {
	n := From(ctx)
	return n != nil && n.Drained.Load()
}
