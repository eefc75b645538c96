package backoff

import (
	"testing"
	"time"
)

// The waits double from Min to Max, each between half and all of its step,
// and Reset starts them over.
func TestWaitsDoubleFromMinToMaxWithJitterAndResetStartsOver(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	for round := range 2 {
		for i, step := range []time.Duration{10, 20, 40, 50, 50} {
			step *= time.Millisecond
			if w := b.Next(); w < step/2 || w > step {
				t.Fatalf("round %d, wait %d: %v, want within [%v, %v]", round, i, w, step/2, step)
			}
		}
		b.Reset()
	}
	var zero Backoff
	if w := zero.Next(); w < DefaultMin/2 || w > DefaultMin {
		t.Errorf("the zero value's first wait %v, want within [%v, %v]", w, DefaultMin/2, DefaultMin)
	}
}
