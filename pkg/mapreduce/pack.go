package mapreduce

import (
	"context"
	"math/bits"
	"strconv"
	"time"
)

// Packing: a map task may carry several pages. asynq's own work per task
// (its enqueue, dequeue and done scripts, ~100–300 µs of CPU on a 2-vCPU
// machine) and the framework's (the run's read, the record) dwarf a page
// whose Map takes microseconds, so that such a job ran at a fraction of
// the rate a bare asynq handler reaches, and a 10M-page run spent most of
// its time in bookkeeping. A run's split therefore measures its pages
// (record.lua sums how long Map took over the pages recorded) and, once
// it has a sample, packs the pages it feeds from then on into tasks of k,
// k chosen so that a task's pages take about packBudget. Pages that take
// longer than half of that (a database query under a permit, typically)
// keep a task each: packing them would only cut the parallelism a run
// gets from its workers.
//
// A run packs from one page on, once: the run hash records k ('pack') and
// the first page packed ('pack_from'), with the feed that moves the fed
// mark past it (feed.lua), so that every split attempt, the orphan scan
// and the reconciler find page i's task by i alone: below pack_from, a
// page is its own task (mapTaskID); from there, pages go by groups, each
// the pages of one aligned block of k (i - i%k), or from pack_from for
// the first one (pagesTaskID names the group's first index). A feed only
// ever ends at the end of a block, or at the split's end, so no group is
// split between two feeds and no two tasks share an ID. Retry forgets the
// decision with the nonce; the measurements stay, so a resumed run packs
// from its first feed.

// packing is how a run's pages go to tasks: from page from on, by groups
// of k; before, and with k < 2, one page a task. A feed that starts in the
// middle of a block (feedFrom) also sends the rest of that block one page
// a task: [lone, loneEnd).
type packing struct {
	k    int
	from int

	lone, loneEnd int
}

// packed reports whether page i goes in a task of several pages.
func (p packing) packed(i int) bool {
	return p.k > 1 && i >= p.from && (i < p.lone || i >= p.loneEnd)
}

// feedFrom returns the packing of a feed whose first page is start. A
// feed after the decision starts at the end of a block, as the feed
// before it ended, unless that one was the split's last and ended inside
// a block: then the split ran again and its Split emitted more pages than
// before (a table that grew, read from a cursor). The group of that block
// has a task already, which would take the new pages' task ID: they go
// one a task instead, up to the end of the block, and the reconciler
// looks for them under their own IDs when the group's task is gone.
func (p packing) feedFrom(start int) packing {
	if p.packed(start) && p.group(start) != start {
		p.lone, p.loneEnd = start, start-start%p.k+p.k
	}
	return p
}

// group returns the first index of page i's group (its task's ID).
func (p packing) group(i int) int {
	if !p.packed(i) {
		return i
	}
	return max(p.from, i-i%p.k)
}

// blockEnd reports whether page i is the last of its group's block, so
// that a feed may end after it with pages still to come.
func (p packing) blockEnd(i int) bool { return !p.packed(i) || (i+1)%p.k == 0 }

// mapTask is one map task: its pages, and the first index of its group
// (the task's ID).
type mapTask struct {
	first  int
	packed bool
	pages  []fedPage
}

// tasks groups pages (ascending) into their map tasks.
func (p packing) tasks(pages []fedPage) []mapTask {
	var ts []mapTask
	for _, pg := range pages {
		g := p.group(pg.i)
		if n := len(ts); n > 0 && ts[n-1].packed && ts[n-1].first == g {
			ts[n-1].pages = append(ts[n-1].pages, pg)
			continue
		}
		ts = append(ts, mapTask{first: g, packed: p.packed(pg.i), pages: []fedPage{pg}})
	}
	return ts
}

// cut returns how many of pages (ascending, the first n of what a feed
// may take) a feed can take without splitting a group between two feeds:
// all of them if the split has ended (final) or the last one ends its
// block, or else up to the start of the last one's group. next, if not
// -1, is the index of the page that follows pages in the split.
func (p packing) cut(pages []fedPage, next int, final bool) int {
	n := len(pages)
	if n == 0 {
		return 0
	}
	last := pages[n-1].i
	switch {
	case next >= 0 && p.group(next) != p.group(last):
		return n
	case next < 0 && (final || p.blockEnd(last)):
		return n
	}
	g := p.group(last)
	for n > 0 && p.group(pages[n-1].i) == g {
		n--
	}
	return n
}

// Packing's knobs.
const (
	// maxPack is the most pages a task carries: JobOptions.PagesPerTask's
	// default and ceiling.
	maxPack = 64
	// packBudget is about how long the pages of one packed task take: the
	// pages of a task take its per-task cost ~10 times over.
	packBudget = 2 * time.Millisecond
	// packSample is how many measured pages a run needs before its split
	// decides.
	packSample = 32
	// probePages is how many pages a split feeds a task each before it
	// waits for packSample of them to be measured (probe).
	probePages = 256
	// probeIdle ends that wait sooner: the queue has had nothing pending
	// for this long, so workers took every task fed and may be idle, and
	// pages still unmeasured are not cheap (cheap ones are recorded
	// within milliseconds of being taken).
	probeIdle = 50 * time.Millisecond
)

// probeWait bounds that wait: workers busy elsewhere, or none running. A
// variable for the tests.
var probeWait = time.Second

// packFor returns how many pages a task should carry for pages whose Map
// took mapUS microseconds in all over n pages, at most limit (a power of
// two): 1 while fewer than packSample are measured or the pages are too
// slow to gain.
func packFor(mapUS, n int64, limit int) int {
	if n < packSample || limit < 2 {
		return 1
	}
	if tooSlowToPack(mapUS, n) {
		return 1
	}
	avg := max(float64(mapUS)/float64(n), 1) // µs a page: 1 for anything faster
	budget := float64(packBudget.Microseconds())
	return min(floorPow2(int(budget/avg)), limit) // a power of two, so that blocks nest
}

// tooSlowToPack reports whether pages whose Map took mapUS microseconds in
// all over n (n > 0) average half of packBudget or more, a millisecond: a
// task's own cost is then a small part of theirs, and packing them would
// only cut a run's parallelism.
func tooSlowToPack(mapUS, n int64) bool {
	return n > 0 && 2*mapUS >= packBudget.Microseconds()*n
}

// floorPow2 is the largest power of two at most n, or 1 for n < 1.
func floorPow2(n int) int { return 1 << max(bits.Len(uint(max(n, 0)))-1, 0) }

// probe runs before an undecided feed that starts at start. Until its
// pages are measured a split cannot tell whether they are cheap, so its
// first feeds go a page a task; and since nothing is measured before
// workers take a task (their poll interval: 100 ms by default), a split
// that fed on would feed its whole first window of cheap pages unpacked.
// So once probePages pages went a page a task, a split waits, at most probeWait and once per
// attempt, until packSample pages are measured or one shows the pages are
// too slow to pack, or the workers have taken every task fed (probeIdle),
// and then decides as before. Slow pages cost the wait for the first of
// them to be recorded, or for the workers to take the probe's tasks:
// either way the workers are busy meanwhile.
func (f *feeder) probe(ctx context.Context, start int) error {
	if f.probed || f.packLimit < 2 {
		return nil
	}
	if f.probeFrom < 0 {
		f.probeFrom = start
	}
	if start-f.probeFrom < probePages {
		return nil
	}
	f.probed = true
	sleep, until := time.Millisecond, time.Now().Add(probeWait)
	var empty time.Time // since when nothing is pending in the queue
	for f.mapN < packSample && !tooSlowToPack(f.mapUS, f.mapN) && time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(sleep):
		}
		sleep = min(2*sleep, maxNap)
		_, _, pending, _, err := f.look(ctx) // updates mapUS and mapN
		switch {
		case err != nil:
			return err
		case pending > 0:
			empty = time.Time{}
		case empty.IsZero():
			empty = time.Now()
		case time.Since(empty) >= probeIdle:
			return nil
		}
	}
	return nil
}

// decidePack decides, before an undecided run's feed from page start,
// whether the run packs its pages from there on, once they are measured
// (probe). It returns the packing the feed records ("" for none yet).
func (f *feeder) decidePack(ctx context.Context, start int) (string, error) {
	if f.pack.k != 0 {
		return "", nil
	}
	if err := f.probe(ctx, start); err != nil {
		return "", err
	}
	// Pack from this feed on, once the pages are measured.
	if k := packFor(f.mapUS, f.mapN, min(f.packLimit, floorPow2(f.allow))); k > 1 {
		f.setPack(packing{k: k, from: start})
		return strconv.Itoa(k), nil
	}
	return "", nil
}
