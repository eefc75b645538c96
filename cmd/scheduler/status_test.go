package main

import (
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

func TestStatusSaysHowARunGivesItsPagesToTasks(t *testing.T) {
	for _, c := range []struct {
		st   mapreduce.Status
		want string
	}{
		{mapreduce.Status{PagesPerTask: 1}, ""},
		{mapreduce.Status{PagesPerTask: 1, MapAverage: 3 * time.Millisecond}, "a task a page (Map takes 3ms a page on average)"},
		{mapreduce.Status{PagesPerTask: 64, PackedFrom: 512}, "64 pages a task from page 512 (Map takes under 1µs a page on average)"},
	} {
		if got := tasksLine(&c.st); got != c.want {
			t.Errorf("%+v: %q, want %q", c.st, got, c.want)
		}
	}
}
