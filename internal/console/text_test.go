package console_test

import (
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

func TestARunsPagesAndTasksReadAsPeopleSayThem(t *testing.T) {
	for _, c := range []struct {
		st           mapreduce.Status
		pages, tasks string
	}{
		{mapreduce.Status{Total: -1, Expected: -1, PagesPerTask: 1}, "?", ""},
		{mapreduce.Status{Total: -1, Expected: 500, PagesPerTask: 1, MapAverage: 3 * time.Millisecond}, "~500", "a task a page (Map takes 3ms a page on average)"},
		{mapreduce.Status{Total: 4096, Expected: -1, PagesPerTask: 64, PackedFrom: 512}, "4096", "64 pages a task from page 512 (Map takes under 1µs a page on average)"},
	} {
		if got := console.PagesText(&c.st); got != c.pages {
			t.Errorf("%+v: pages %q, want %q", c.st, got, c.pages)
		}
		if got := console.TasksText(&c.st); got != c.tasks {
			t.Errorf("%+v: tasks %q, want %q", c.st, got, c.tasks)
		}
	}
}
