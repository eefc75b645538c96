package semaphore

import (
	"context"
	"errors"
	"testing"

	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// A requeue notice is for the token it was sent for. A second refresh can
// report the same lost place after the waiter read the first notice and
// before it queued again under a new token; that notice, read under the new
// token, would send the waiter to the back of the queue a second time
// (S2). The window is between two statements of Acquire, too short to hit
// from outside, so this drives the steps by hand.
func TestARequeueNoticeDoesNotOutliveItsToken(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	s, err := New(rdb, "db", Options{Limit: 1, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	w := &waiter{weight: 1, ctx: context.Background(), ch: make(chan wakeup, 2)}
	if err := s.enlist(w); err != nil {
		t.Fatal(err)
	}
	old := s.tokenOf(w)
	s.requeue(old)
	if m := <-w.ch; !m.requeue { // Acquire reads the first refresh's notice
		t.Fatalf("got %+v, want a requeue notice", m)
	}
	s.requeue(old) // a second refresh's word on the same place
	if err := s.enlist(w); err != nil {
		t.Fatal(err)
	}
	if n := len(w.ch); n != 0 {
		t.Fatalf("%d notice(s) for the old token %s wait for the waiter, now %s", n, old, s.tokenOf(w))
	}

	// A notice for the new token reaches it; a final answer is never dropped.
	s.requeue(s.tokenOf(w))
	if m := <-w.ch; !m.requeue {
		t.Fatalf("got %+v, want a requeue notice for the new token", m)
	}
	final := errors.New("the final answer")
	w.ch <- wakeup{err: final}
	if err := s.enlist(w); err != nil {
		t.Fatal(err)
	}
	if len(w.ch) != 1 {
		t.Fatalf("%d messages wait, want the final answer alone", len(w.ch))
	}
	if m := <-w.ch; m.requeue || !errors.Is(m.err, final) {
		t.Fatalf("got %+v, want the final answer", m)
	}
}
