package shorten_test

import (
	"testing"
	"unicode/utf8"

	"github.com/batchmr/batchmr/internal/shorten"
)

func TestToCutsAtACharacterBoundary(t *testing.T) {
	for _, tc := range []struct {
		s    string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"abcdefghijk", 5, "abcde…"},
		{"ab€cd", 3, "ab…"}, // € is 3 bytes: not split
		{"ab€cd", 5, "ab€…"},
	} {
		got := shorten.To(tc.s, tc.max)
		if got != tc.want || !utf8.ValidString(got) {
			t.Errorf("To(%q, %d) = %q, want %q", tc.s, tc.max, got, tc.want)
		}
	}
}
