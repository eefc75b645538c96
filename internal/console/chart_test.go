package console_test

import (
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/console"
)

// The line of the controller's shadow N starts anew after each stretch
// outside shadow mode, instead of joining across it, and is absent when
// the semaphore was never in shadow mode.
func TestTheShadowNsLineBreaksWhereShadowModeWasOff(t *testing.T) {
	t.Parallel()
	if p := console.ShadowPath(0, 0, 0); p != "" {
		t.Errorf("never in shadow mode, the chart draws %q", p)
	}
	var cmds []string
	for _, f := range strings.Fields(console.ShadowPath(0, 3, 3, 0, 5, 6)) {
		cmds = append(cmds, f[:1])
	}
	if got := strings.Join(cmds, ""); got != "MLML" {
		t.Errorf("shadow Ns 0 3 3 0 5 6 draw the commands %q, want MLML (a gap at the 0)", got)
	}
}
