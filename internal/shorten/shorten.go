// Package shorten cuts text that is kept or logged to a bound.
package shorten

import "unicode/utf8"

// To returns s if it is at most max bytes long, and otherwise its first
// max bytes or fewer, cut at a character boundary so that the result stays
// valid UTF-8, followed by "…".
func To(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
