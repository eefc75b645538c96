package mapreduce

import (
	"slices"
	"testing"
)

func pagesAt(idx ...int) []fedPage {
	ps := make([]fedPage, len(idx))
	for n, i := range idx {
		ps[n] = fedPage{i: i}
	}
	return ps
}

func TestPackingGroupsPagesByAlignedBlocksFromWhereItStarts(t *testing.T) {
	p := packing{k: 4, from: 6}
	var got [][]int
	for _, tk := range p.tasks(pagesAt(4, 5, 6, 7, 8, 9, 11, 12, 16)) {
		var is []int
		for _, pg := range tk.pages {
			is = append(is, pg.i)
		}
		got = append(got, append([]int{tk.first}, is...))
	}
	// first index of the task, then its pages: 4 and 5 alone (before
	// from), 6–7 (a block cut at from), 8–11 with a gap, 12, 16.
	want := [][]int{{4, 4}, {5, 5}, {6, 6, 7}, {8, 8, 9, 11}, {12, 12}, {16, 16}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("tasks %v, want %v", got, want)
	}
	if ts := (packing{}).tasks(pagesAt(0, 1)); len(ts) != 2 || ts[0].packed || ts[1].first != 1 {
		t.Errorf("no packing: %+v, want a task a page", ts)
	}
}

func TestAFeedEndsOnlyAtTheEndOfABlock(t *testing.T) {
	p := packing{k: 4, from: 0}
	for _, c := range []struct {
		pages []int
		next  int
		final bool
		want  int
	}{
		{[]int{0, 1, 2, 3, 4, 5}, -1, false, 4}, // 4 and 5 wait for 6 and 7
		{[]int{0, 1, 2, 3, 4, 5}, -1, true, 6},  // the split ended
		{[]int{0, 1, 2, 3, 4, 5, 6, 7}, -1, false, 8},
		{[]int{0, 1, 2}, 3, false, 0}, // room for 3: the block waits
		{[]int{0, 1, 2, 3}, 5, false, 4},
		{[]int{0, 1, 2, 3, 5}, 8, false, 5}, // 6 and 7 recorded: 8 starts a block
		{[]int{1, 2}, -1, false, 0},
	} {
		if got := p.cut(pagesAt(c.pages...), c.next, c.final); got != c.want {
			t.Errorf("cut(%v, next %d, final %v) = %d, want %d", c.pages, c.next, c.final, got, c.want)
		}
	}
	if got := (packing{}).cut(pagesAt(0, 1, 2), -1, false); got != 3 {
		t.Errorf("no packing: cut %d, want all 3", got)
	}
}

func TestTasksCarryAbout2msOfPages(t *testing.T) {
	for _, c := range []struct {
		us, n int64
		limit int
		want  int
	}{
		{0, packSample - 1, 64, 1}, // not measured enough
		{32, 32, 64, 64},           // 1 µs a page
		{3200, 32, 64, 16},         // 100 µs: 20 fit, 16 is the power of two below
		{32000, 32, 64, 1},         // 1 ms: 2 fit in 2 ms, packing gains little
		{25000, 32, 64, 2},
		{32, 32, 8, 8}, // the job's or the window's limit
		{32, 32, 1, 1}, // PagesPerTask 1
		{0, 1000, 64, 64},
	} {
		if got := packFor(c.us, c.n, c.limit); got != c.want {
			t.Errorf("packFor(%d µs over %d pages, limit %d) = %d, want %d", c.us, c.n, c.limit, got, c.want)
		}
	}
}

func TestAFeedThatStartsInsideABlockSendsTheRestOfItOneATask(t *testing.T) {
	p := packing{k: 4, from: 0}.feedFrom(10) // the feed before ended at 9, inside block 8–11
	var got []int
	for _, tk := range p.tasks(pagesAt(10, 11, 12, 13, 14, 15, 16)) {
		got = append(got, tk.first, len(tk.pages))
	}
	// 10 and 11 alone, then whole groups: 12–15 and 16.
	if want := []int{10, 1, 11, 1, 12, 4, 16, 1}; !slices.Equal(got, want) {
		t.Errorf("tasks (first, pages) %v, want %v", got, want)
	}
	if q := (packing{k: 4, from: 0}).feedFrom(12); q.lone != q.loneEnd {
		t.Errorf("a feed from a block's start: %+v, want no pages alone", q)
	}
	if q := (packing{k: 4, from: 6}).feedFrom(6); q.lone != q.loneEnd {
		t.Errorf("the feed that starts packing: %+v, want no pages alone", q)
	}
}
