package console

import (
	"fmt"
	"strings"
	"time"
)

// chart is an inline SVG line chart of a semaphore's samples, all on one
// scale: the limit N, the weight held, the requests waiting and, in
// shadow mode, the N the controller would set.
type chart struct {
	Width, Height int
	Limit, Held   string // polyline points
	Waiters       string
	Shadow        string // path data, "" unless a sample has a shadow N
	Max           int    // the top of the scale
	Span          string // the time the x axis covers
	Empty         bool
	Last          sample
}

const chartW, chartH = 600, 160

func drawChart(s []sample, span time.Duration) chart {
	ch := chart{Width: chartW, Height: chartH, Span: duration(span), Empty: len(s) == 0, Max: 1}
	if len(s) == 0 {
		return ch
	}
	ch.Last = s[len(s)-1]
	for _, x := range s {
		ch.Max = max(ch.Max, x.limit, x.held, x.waiters, x.shadow)
	}
	end := s[len(s)-1].at
	xOf := func(t time.Time) float64 {
		return float64(chartW) * (1 - float64(end.Sub(t))/float64(span))
	}
	yOf := func(v int) float64 {
		return float64(chartH-4) - float64(v)*float64(chartH-8)/float64(ch.Max)
	}
	var limit, held, waiters, shadow strings.Builder
	gap := true
	for _, x := range s {
		px := max(0, xOf(x.at))
		fmt.Fprintf(&limit, "%.1f,%.1f ", px, yOf(x.limit))
		fmt.Fprintf(&held, "%.1f,%.1f ", px, yOf(x.held))
		fmt.Fprintf(&waiters, "%.1f,%.1f ", px, yOf(x.waiters))
		switch {
		case x.shadow == 0: // outside shadow mode: a gap in its line
			gap = true
		case gap:
			fmt.Fprintf(&shadow, "M%.1f,%.1f ", px, yOf(x.shadow))
			gap = false
		default:
			fmt.Fprintf(&shadow, "L%.1f,%.1f ", px, yOf(x.shadow))
		}
	}
	ch.Limit, ch.Held, ch.Waiters, ch.Shadow = limit.String(), held.String(), waiters.String(), shadow.String()
	return ch
}
