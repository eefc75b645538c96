package mapreduce

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// A run's window: the split enqueues a page only while the run has fewer
// than JobOptions.Window pages enqueued or in flight, so that a run of any
// size keeps a bounded number of asynq tasks, and so Redis memory, and
// shares its queue with the job's other runs. The run hash counts the
// pages the split has passed ("fed") and the recorded ones among them
// ("fed_done"): feed.lua moves the first, record.lua counts the second.
//
// Besides the window, a split tops its queue up only while asynq's list of
// pending tasks is short (the backlog): a run started behind a large one
// then waits behind at most that many of its pages, not behind a window's
// worth. The first fill of a run is exempt, so that a small run enqueues
// all of its pages at once.

// defaultWindow is JobOptions.Window's default: about 6 MiB of asynq tasks.
const defaultWindow = 10_000

// windowSizes returns, for a window, how many pages the split waits for
// room to enqueue at once (batch), and the least number of pending tasks
// of its queue it tops up to (backlog). A split whose pages are recorded
// faster tops up to what its workers take in backlogFor (feeder.backlog).
func windowSizes(window int) (batch, backlog int) {
	batch = min(max(window/4, 1), 64)
	backlog = max(2*batch, min(window, 256))
	return batch, backlog
}

// backlogFor is how much work a split keeps pending in its queue: enough
// to keep its workers busy between two of its reads, and little enough
// that a run started behind it starts soon. A small run waits behind it
// three times (its split, its pages, its reduce). Once the split fed as
// fast as its workers took tasks, a 1 000-page run took 2.2–2.8 times as
// long during a large run as alone at 50 ms, and up to 2.1 at 20 ms
// (mrbench, at its 10 ms poll interval; the rate is the fastest seen, so
// this is less of the mean's work than it says).
const backlogFor = 10 * time.Millisecond

// maxNap is the longest a split that waits for room sleeps between two
// looks.
const maxNap = 20 * time.Millisecond

// asleepAfter is how long a packing run's tasks may be pending with none
// recorded before its split takes its workers for asleep: its tasks take
// milliseconds.
const asleepAfter = 100 * time.Millisecond

// A worker that finds its queue empty sleeps for its poll interval (a
// second by asynq's default, 100 ms by the worker command's) before any of
// its idle slots looks again, and one that wakes takes what is pending a
// dequeue at a time, ~0.1–0.2 ms each: a packing run's cheap tasks, a few
// dozen, in milliseconds. Unless its split tops the queue up before the
// worker finds it empty, the worker sleeps again, the rate the backlog
// follows falls with it, and the run crawls in bursts (BENCHMARKS.md,
// "Keeping a packing run's queue fed"). So a packing run keeps
// pending as many tasks as its workers were seen running at once, and at
// least packedPending (before they are seen), and its split, waiting for
// room, looks every packedNap. Once it has seen them asleep with its
// tasks pending, it keeps twice as many: when a worker wakes, its slots
// take the first half at once, and the split tops the queue up while
// they run it. (Twice as many from the start would cost a run started
// behind it: at a 10 ms interval, a 1 000-page run read 1.6–1.9 times
// its time alone.)
const (
	packedPending = 32
	packedNap     = 2 * time.Millisecond
)

// errHandedOff ends a Split whose feeder has handed the rest of the run to
// a new split task (feeder.handOff).
var errHandedOff = errors.New("mapreduce: the split was handed over to a new split task")

// fedPage is a page Split emitted that waits for room in the window.
type fedPage struct {
	i      int
	page   []byte
	cursor string // SetSplitCursor's cursor for it, or ""
}

// feeder enqueues a split's pages within the run's window. Split's emit
// buffers pages (add); one goroutine (loop) takes what is buffered, waits
// for room, and feeds it: one feed.lua call moves the run's fed mark past
// the pages and stores them, with the cursor of the last one, as the
// run's "feeding" pages; then it enqueues them and waits for the
// enqueues. So every page below fed is enqueued, recorded, or stored in
// Redis, and a split that starts again after a crash or a hand-on enqueues the stored
// ones itself and goes on after the last fed page: from its cursor if
// Split resumes from one (ResumeSplit), or by position.
// A lone page goes at once; pages emitted while a feed is under way go
// together in the next one.
//
// A split handler makes the feeder of its attempt (newFeeder) and runs
// Split through it (split); the rest is the feeder's own.
type feeder struct {
	c       *Client
	k       runKeys
	run     string
	nonce   string
	o       JobOptions
	pending string // asynq's list of the queue's pending tasks
	active  string // and of its running ones
	step    string // this task's ID past "<run>:<nonce>:", or "" if unknown
	token   string // this attempt's, stored with each of its feeds
	started time.Time
	sc      *splitState // numbers the pages Split emits (restore)

	bits     []byte    // the recorded pages when the attempt began
	waited   bool      // this task has waited for room
	fed      int       // pages below it are enqueued, recorded, or stored as feeding
	redo     []fedPage // pages an earlier attempt fed, to enqueue again first
	redoFrom int       // where their feed began
	allow    int       // unrecorded pages past fed that the window has room for
	counted  int       // pages below it were fed by an earlier attempt: the window counts them

	mu      sync.Mutex
	ready   *sync.Cond // buf changed, Split returned, or ctx ended
	buf     []fedPage  // emitted, not yet fed
	closed  bool       // Split returned: feed what is buffered, then end
	feedCap int        // the most pages buffered: maxFeed tasks' worth (setPack)

	pack      packing // how the run's pages go to tasks (pack.go)
	packLimit int     // the most pages a task may carry: PagesPerTask, within the window's batch
	mapUS     int64   // µs Map took over mapN recorded pages, as of the last read
	mapN      int64
	probeFrom int  // the first page this attempt fed undecided, or -1 (probe)
	probed    bool // this attempt has waited for measured pages, or will not

	rateDone  int       // pages recorded when the rate was last measured
	rateAt    time.Time // when
	rate      float64   // the most pages recorded per second, over 100 ms or more
	busy      int       // the most of a packing run's tasks seen running at once (waitRoom)
	sawAsleep bool      // its workers were seen asleep with its tasks pending (waitRoom)
}

// windowFields are the fields of the run's hash a split's feeder starts
// from (newFeeder): where the last attempt's feeds ended, and the run's
// packing.
var windowFields = []string{"resume", "fed", "cursor", "feeding", "pack", "pack_from"}

// newFeeder returns the feeder of the split task that ctx runs for s,
// from the run's record rec (windowFields) and its bitmap of recorded
// pages as the handler read them: it goes on where the last attempt's
// feeds ended (restore).
func (c *Client) newFeeder(ctx context.Context, s *step, rec runRecord, recorded []byte) *feeder {
	f := &feeder{c: c, k: s.k, run: s.runID, nonce: s.nonce, o: s.o, pending: pendingKey(s.o.Queue), active: activeKey(s.o.Queue),
		started: time.Now(), probeFrom: -1, bits: recorded, token: newNonce()}
	f.ready = sync.NewCond(&f.mu)
	var pk packing
	if pack := atoi(rec["pack"]); pack > 1 {
		pk = packing{k: pack, from: atoi(rec["pack_from"])}
	}
	f.setPack(pk)
	batch, _ := windowSizes(s.o.Window)
	f.packLimit = min(s.o.PagesPerTask, floorPow2(batch))
	if id, ok := asynq.GetTaskID(ctx); ok {
		if step, ok := strings.CutPrefix(id, taskID(s.runID, s.nonce, "")); ok {
			f.step = step
		}
	}
	f.restore(ctx, rec)
	return f
}

// restore sets where the attempt goes on from. Pages below the run's
// resume mark are enqueued or recorded. Those in [resume, fed) were fed,
// and the last feed stored them, with the cursor of page fed-1: they are
// enqueued again (redo), since a crash may have come before their
// enqueues, and the split goes on after them. Without a stored feed that
// ends at fed-1 (it is unreadable, or something other than batchmr
// changed the record), Split runs from the start, and its pages in
// [resume, fed) are enqueued again as it emits them. Split may resume
// from the cursor only after the last feed (sc).
func (f *feeder) restore(ctx context.Context, rec runRecord) {
	resume, fed := atoi(rec["resume"]), atoi(rec["fed"])
	f.fed, f.counted, f.redoFrom = resume, fed, resume
	last := false // the stored feed is the last one
	if feeding, ok := rec["feeding"]; ok && fed > 0 {
		pages, err := decodeFeeding([]byte(feeding))
		switch {
		case err != nil:
			Logger(ctx).Warn("mapreduce: the pages the split fed last are unreadable; Split runs again from the start to enqueue them", "error", err)
		case len(pages) > 0 && pages[len(pages)-1].i == fed-1:
			last = true
			for _, p := range pages {
				if p.i >= resume && !bitSet(f.bits, p.i) {
					f.redo = append(f.redo, p)
				}
			}
			f.fed = max(fed, resume)
		}
	}
	cursor, hasCursor := rec["cursor"]
	f.sc = &splitState{cursor: cursor, has: hasCursor && last, base: fed, expect: f.expect}
}

// expect records the pages the run expects in all (ExpectPages).
func (f *feeder) expect(ctx context.Context, n int) error {
	return f.c.ledger.expectPages(ctx, f.k, f.nonce, n)
}

// split runs the job's Split (r) with args, feeding the pages it emits
// while it runs, and returns once Split has returned and every page it
// emitted is fed, or feeding stopped: how many pages the run has (n),
// Split's error, and why feeding stopped (stopped): nil if it did not, a
// hand-on (errHandedOff), a run that moved on (errRunGone,
// errSplitTaken), ctx's cause, an enqueue's error, or Split's. The pages
// still buffered when Split fails wait for a retry: it emits them again.
func (f *feeder) split(ctx context.Context, r jobRunner, args []byte) (n int, splitErr, stopped error) {
	ctx = context.WithValue(ctx, splitKey, f.sc)
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	defer context.AfterFunc(ctx, f.wake)()
	e := &emitter{ctx: ctx, f: f, skip: f.fed} // before loop moves f.fed
	fedAll := make(chan struct{})
	go func() {
		defer close(fedAll)
		if err := f.loop(ctx); err != nil {
			abort(err)
		}
	}()
	splitErr = r.split(ctx, args, e.emit)
	n = e.close()
	if splitErr != nil {
		abort(splitErr)
	}
	f.close()
	<-fedAll
	return n, splitErr, context.Cause(ctx)
}

// handedOn reports whether feeding stopped (split's stopped) because
// another split task goes on with the run, or the run moved on without
// this one: the split task then ends, and has nothing to record.
func handedOn(stopped error) bool {
	return errors.Is(stopped, errHandedOff) || errors.Is(stopped, errRunGone) || errors.Is(stopped, errSplitTaken)
}

// emitter is the emit that split gives Split: it numbers the pages Split
// emits (splitState) and buffers those that no earlier attempt fed or
// recorded. Split must call it from one goroutine, in a deterministic
// order (page numbers must be the same on retry); the mutex only keeps a
// misuse from corrupting the count. It fails after Split returned, and
// once feeding stopped (ctx).
type emitter struct {
	ctx  context.Context
	f    *feeder
	skip int // pages below it were fed by an earlier attempt

	mu     sync.Mutex
	closed bool
}

func (e *emitter) emit(page []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.ctx.Err() != nil:
		return context.Cause(e.ctx)
	case e.closed:
		return errors.New("mapreduce: emit called after Split returned")
	}
	i, cursor := e.f.sc.emitting()
	if i >= maxPages {
		return fmt.Errorf("mapreduce: a run has at most %d pages", maxPages)
	}
	if i < e.skip || bitSet(e.f.bits, i) {
		return nil // fed by an earlier attempt, or recorded
	}
	return e.f.add(e.ctx, fedPage{i: i, page: page, cursor: cursor})
}

// close ends emit, once Split returned, and returns how many pages the
// run has.
func (e *emitter) close() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return e.f.sc.pages()
}

// maxFeed is the most tasks one feed enqueues: their pages are what the
// run stores of them until they are enqueued, and what is enqueued
// between two waits. It counts tasks, not pages, so that a packing run
// feeds its workers as many tasks a round trip as one that does not: at
// 256 pages a feed, a run packing 64 pages a task fed 4 tasks a round
// trip, its workers drained the queue faster, found it empty, and slept
// for their poll interval (BENCHMARKS.md, "Keeping a packing run's queue
// fed").
const maxFeed = 256

// setPack sets how the split's pages go to tasks from now on, and so how
// many pages a feed may take.
func (f *feeder) setPack(p packing) {
	f.pack = p
	f.mu.Lock()
	// More than the window is never fed at once.
	f.feedCap = min(maxFeed*max(p.k, 1), max(f.o.Window, maxFeed))
	f.mu.Unlock()
}

// add buffers a page Split emitted, waiting while a feed's worth waits.
func (f *feeder) add(ctx context.Context, p fedPage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.buf) >= f.feedCap && ctx.Err() == nil {
		f.ready.Wait()
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	f.buf = append(f.buf, p)
	f.ready.Broadcast()
	return nil
}

// close tells loop that Split returned: it feeds what is buffered, then
// ends.
func (f *feeder) close() {
	f.mu.Lock()
	f.closed = true
	f.ready.Broadcast()
	f.mu.Unlock()
}

// wake wakes add and loop, to see that their context ended.
func (f *feeder) wake() {
	f.mu.Lock()
	f.ready.Broadcast()
	f.mu.Unlock()
}

// loop feeds buffered pages until Split has returned and every page it
// emitted is fed, or ctx ends, or feeding fails or hands on (its error).
// Call wake when ctx ends.
func (f *feeder) loop(ctx context.Context) error {
	if err := f.c.enqueuePages(ctx, f.run, f.nonce, f.redo, f.o, f.pack.feedFrom(f.redoFrom)); err != nil {
		return fmt.Errorf("enqueuing again the pages fed before the split started: %w", err)
	}
	held := 0 // pages buffered that wait for the rest of their group
	for {
		f.mu.Lock()
		for len(f.buf) <= held && !f.closed && ctx.Err() == nil {
			f.ready.Wait()
		}
		take := append([]fedPage(nil), f.buf...)
		final := f.closed
		f.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		if len(take) == 0 {
			return nil // Split returned, and every page is fed
		}
		n, err := f.feed(ctx, take, final)
		held = 0
		if n == 0 && err == nil {
			held = len(take)
		}
		f.mu.Lock()
		f.buf = f.buf[:copy(f.buf, f.buf[n:])]
		f.ready.Broadcast()
		f.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// feed waits for room in the window, then feeds as many of pages as it
// has room for, and returns how many: none if they are the start of a
// group whose other pages Split has yet to emit (final: it has returned,
// and there are none). Pages an earlier attempt fed (below counted) need
// no room.
func (f *feeder) feed(ctx context.Context, pages []fedPage, final bool) (int, error) {
	if pages[0].i < f.counted {
		return f.send(ctx, f.refeed(pages, final))
	}
	b, err := f.withRoom(ctx, pages, final)
	if err != nil {
		return 0, err
	}
	return f.send(ctx, b)
}

// feedBatch is what one feed may take: the first pages of what is
// buffered, to cut (send) so that no group is split between two feeds.
type feedBatch struct {
	pages []fedPage
	next  int     // the index of the page after them, if buffered, or -1
	final bool    // none follows them: Split has returned
	pk    packing // how they go to tasks
	from  any     // the fed mark the feed moves from, "" for pages an earlier attempt fed: feed.lua checks it
	pack  string  // the run's packing, if this feed decides it (decidePack)
}

// refeed returns the batch of the first of pages that an earlier attempt
// fed (below counted): they need no room.
func (f *feeder) refeed(pages []fedPage, final bool) feedBatch {
	n := 0
	for n < len(pages) && pages[n].i < f.counted {
		n++
	}
	b := feedBatch{pages: pages[:n], next: -1, pk: f.pack, from: ""}
	if n < len(pages) {
		b.next = pages[n].i
	}
	// An earlier attempt fed up to counted, at the end of a block.
	b.final = final || n < len(pages) || pages[n-1].i == f.counted-1
	return b
}

// withRoom returns the batch of the first of pages that the window has
// room for, after waiting for room if the last wait's is used up, or hands
// the run on (errHandedOff) if the split has run past half its timeout.
// An undecided run decides its packing first (decidePack).
func (f *feeder) withRoom(ctx context.Context, pages []fedPage, final bool) (feedBatch, error) {
	fresh := f.allow == 0 // room just made: at least a batch
	if fresh {
		if err := f.waitRoom(ctx); err != nil {
			return feedBatch{}, err
		}
	} else if f.pastHalf() {
		return feedBatch{}, f.handOff(ctx)
	}
	start := max(f.fed, f.counted) // the fed mark this feed moves from
	b := feedBatch{pages: pages, next: -1, final: final, from: start}
	if n := min(len(pages), f.allow); n < len(pages) {
		b.next, b.pages = pages[n].i, pages[:n]
		if f.pack.feedFrom(start).cut(b.pages, b.next, false) == 0 {
			if !fresh {
				// The room left is less than the next group: wait for
				// more (waitRoom makes room for a batch, which holds a
				// group whole).
				f.allow = 0
				return f.withRoom(ctx, pages, final)
			}
			// A batch that cannot hold a group: the run packs by more
			// than its window allows now (a deploy that shrank Window
			// mid-run). Feed the group whole, past the window by less
			// than a group, rather than wait for room that never comes.
			b.pages, b.next = firstGroup(pages, f.pack.feedFrom(start))
		}
	}
	pack, err := f.decidePack(ctx, start)
	if err != nil {
		return feedBatch{}, err
	}
	b.pack, b.pk = pack, f.pack.feedFrom(start)
	return b, nil
}

// firstGroup returns the pages of the first of pages' group as pk packs
// them, and the index of the page after them, or -1.
func firstGroup(pages []fedPage, pk packing) (group []fedPage, next int) {
	g, n := pk.group(pages[0].i), 0
	for n < len(pages) && pk.group(pages[n].i) == g {
		n++
	}
	if n < len(pages) {
		return pages[:n], pages[n].i
	}
	return pages, -1
}

// send feeds the pages of b that end a group, or all of them if no page
// follows them (cut): one feed.lua call moves the run's fed mark past
// them and stores them as its feeding pages, then their tasks are
// enqueued. It returns how many it fed.
func (f *feeder) send(ctx context.Context, b feedBatch) (int, error) {
	n := b.pk.cut(b.pages, b.next, b.final)
	if n == 0 {
		if b.pack != "" {
			f.setPack(packing{}) // not recorded: decide again with the next feed
		}
		return 0, nil
	}
	pages := b.pages[:n]
	if b.from != "" {
		f.allow = max(f.allow-n, 0) // a group fed whole may pass it (withRoom)
	}
	last := pages[len(pages)-1]
	args := []any{f.nonce, f.fed, last.i + 1, "", "", last.cursor, encodeFeeding(pages), b.from, f.step, f.token, b.pack}
	if _, _, _, _, err := f.read(ctx, args...); err != nil {
		return 0, err
	}
	f.fed = last.i + 1
	return len(pages), f.c.enqueuePages(ctx, f.run, f.nonce, pages, f.o, b.pk)
}

// waitRoom waits until the window has room for a batch of pages past fed
// (f.allow), or hands the run on (errHandedOff) if the split has run past
// half its timeout or has stalled.
func (f *feeder) waitRoom(ctx context.Context) error {
	if f.pastHalf() {
		return f.handOff(ctx)
	}
	batch, least := windowSizes(f.o.Window)
	sleep, lastDone, stalledSince := time.Millisecond, -1, time.Now()
	for {
		fed, done, pending, active, err := f.look(ctx)
		if err != nil {
			return err
		}
		free, nap := f.room(fed, done, pending, active, least)
		if free >= batch || (free > 0 && fed == 0) {
			f.allow = free
			return nil
		}
		if done != lastDone {
			lastDone, stalledSince = done, time.Now()
		} else if f.pack.k > 1 && pending > 0 && time.Since(stalledSince) > asleepAfter {
			// Cheap tasks pending, none taken: the workers found the
			// queue empty and sleep for their poll interval. When they
			// wake, their slots take a task each at once; keep twice as
			// many pending from now on, so that the split tops the
			// queue up before the rest are taken.
			f.sawAsleep = true
		}
		f.waited = true
		if f.pastHalf() || (pending > 0 && time.Since(stalledSince) > f.c.stallHandOff) {
			return f.handOff(ctx)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(sleep):
		}
		sleep = min(2*sleep, nap)
	}
}

// room returns how many pages past fed the window has room for, given
// the run's fed and fed_done marks and how many of its queue's tasks are
// pending and running, with a backlog of at least least (windowSizes);
// and how long waitRoom sleeps at most before it looks again. The first
// fill of a run is exempt from the backlog: a small run enqueues at once.
func (f *feeder) room(fed, done, pending, active, least int) (free int, nap time.Duration) {
	free, nap = f.o.Window-(fed-done), maxNap
	if fed == 0 {
		return free, nap
	}
	k := max(f.pack.k, 1) // a pending task holds up to k pages
	floor := least
	if k > 1 {
		// Tasks running: the window's pages neither pending nor
		// recorded, but for those waiting for a retry, which the
		// queue's running tasks bound.
		f.busy = max(f.busy, min((fed-done-pending*k+k-1)/k, active))
		n := f.busy
		if f.sawAsleep {
			n *= 2
		}
		floor = max(least, max(packedPending, n)*k)
		nap = packedNap
	}
	return min(free, f.backlog(done, floor)-pending*k), nap
}

// look reads the run's window and measurements (read) without feeding,
// and ends this attempt (errSplitTaken) if another attempt of the split
// is feeding: a copy made while this one seemed dead goes on, and this
// one ends, so that no page index is fed twice with pages Split cut
// differently.
func (f *feeder) look(ctx context.Context) (fed, done, pending, active int, err error) {
	fed, done, pending, active, err = f.read(ctx, f.nonce, f.fed, 0)
	if err == nil && fed > max(f.fed, f.counted) {
		err = f.taken(ctx)
	}
	return fed, done, pending, active, err
}

// encodeFeeding encodes the pages of a feed for the run hash's "feeding"
// field: for each, its index and its length as uvarints, then its bytes.
func encodeFeeding(pages []fedPage) []byte {
	var b []byte
	for _, p := range pages {
		b = binary.AppendUvarint(b, uint64(p.i))
		b = binary.AppendUvarint(b, uint64(len(p.page)))
		b = append(b, p.page...)
	}
	return b
}

// decodeFeeding decodes encodeFeeding's bytes.
func decodeFeeding(b []byte) ([]fedPage, error) {
	var pages []fedPage
	for len(b) > 0 {
		i, n := binary.Uvarint(b)
		if n <= 0 || i >= maxPages {
			return nil, errors.New("a bad page index")
		}
		b = b[n:]
		size, n := binary.Uvarint(b)
		if n <= 0 || size > uint64(len(b)-n) {
			return nil, errors.New("a bad page length")
		}
		b = b[n:]
		pages = append(pages, fedPage{i: int(i), page: b[:size:size]})
		b = b[size:]
	}
	return pages, nil
}

// backlog returns how many pending tasks the split tops its queue up to:
// what its run's pages are recorded at in backlogFor, at least least and
// at most the window. done is the run's fed_done.
func (f *feeder) backlog(done, least int) int {
	now := time.Now()
	if f.rateAt.IsZero() || done < f.rateDone {
		f.rateDone, f.rateAt = done, now
	} else if dt := now.Sub(f.rateAt); dt >= 100*time.Millisecond {
		// The fastest, not the mean: while its workers sleep for their
		// poll interval, a run's rate falls, and the backlog that
		// followed it would shrink until they found the queue empty at
		// every wake.
		f.rate = max(f.rate, float64(done-f.rateDone)/dt.Seconds())
		f.rateDone, f.rateAt = done, now
	}
	return min(max(least, int(f.rate*backlogFor.Seconds())), f.o.Window)
}

// pendingKey is asynq's list of a queue's pending tasks (asynq's
// base.PendingKey, the same in every release batchmr supports; a test
// checks it against asynq's Inspector).
func pendingKey(queue string) string { return "asynq:{" + queue + "}:pending" }

// activeKey is asynq's list of a queue's running tasks (base.ActiveKey;
// checked as pendingKey is).
func activeKey(queue string) string { return "asynq:{" + queue + "}:active" }

// stallHandOff is how long a feeder waits for room while none of its
// run's pages is recorded and its queue has pending tasks before it hands
// the run to a new split task, freeing the worker slot it holds: on a
// worker whose every slot holds a split, no page could run.
const stallHandOff = 30 * time.Second

// pastHalf reports whether the split task has waited for room and run for
// half its timeout: it then hands on at its next batch (room), before
// asynq's deadline ends it and spends one of the job's retries. A split
// that never waited is Split's own work, which SplitTimeout bounds as it
// did before windows: handing it on would only make the next task call
// Split again from the start.
func (f *feeder) pastHalf() bool { return f.waited && time.Since(f.started) > f.o.SplitTimeout/2 }

// read runs feed.lua with args (see the script) and reads the lengths of
// the queue's lists of pending and running (active) tasks, in one round
// trip, which the run's handlers' calls may share (batch.go).
func (f *feeder) read(ctx context.Context, args ...any) (fed, done, pending, active int, err error) {
	var (
		res  *redis.Cmd
		n, a *redis.IntCmd
	)
	err = withRedis(ctx, f.c.outages, "moving the run's window", func(ctx context.Context) error {
		if err := f.c.ledger.batch(f.k.job).doScript(ctx, scriptFeed, func(p redis.Pipeliner) *redis.Cmd {
			res = scriptFeed.EvalSha(ctx, p, []string{f.k.run, f.k.recorded}, args...)
			n = p.LLen(ctx, f.pending)
			a = p.LLen(ctx, f.active)
			return res
		}); err != nil {
			return err
		}
		return errors.Join(res.Err(), n.Err(), a.Err())
	})
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("mapreduce: split of %s: %w", f.run, err)
	}
	v, _ := res.Slice()
	fed64, _ := v[0].(int64)
	mine := max(f.fed, f.counted) // Redis has every page below it as fed
	switch fed64 {
	case -1:
		return 0, 0, 0, 0, errRunGone
	case -2:
		// The run's fed mark is not the one this feed moved from.
		theirs, ok := int64(0), len(v) >= 3
		if ok {
			theirs, ok = v[2].(int64)
		}
		if !ok || int(theirs) >= mine {
			return 0, 0, 0, 0, f.taken(ctx)
		}
		fed64 = theirs
	}
	if int(fed64) < mine {
		return 0, 0, 0, 0, f.rolledBack(ctx, int(fed64))
	}
	done64, _ := v[1].(int64)
	if len(v) >= 5 {
		f.mapUS, _ = v[3].(int64)
		f.mapN, _ = v[4].(int64)
	}
	return int(fed64), int(done64), int(n.Val()), int(a.Val()), nil
}

// errRunGone stops a feeder whose run is no longer splitting under its
// nonce: it ended, was resumed by Retry, or another attempt finished the
// split.
var errRunGone = errors.New("mapreduce: the run is no longer splitting")

// taken logs that another attempt of the split fed past this one, and
// returns errSplitTaken.
func (f *feeder) taken(ctx context.Context) error {
	Logger(ctx).Info("mapreduce: another attempt of the split is feeding the run (a copy of a task whose worker seemed dead); this one ends", "fed", f.fed)
	return errSplitTaken
}

// rolledBack hands the run on to a new split task that starts from what
// Redis has: its fed mark is behind this attempt's, so it lost this
// attempt's last feeds (a restart from an append-only file that missed
// its last second), and maybe their enqueues, which a new attempt makes
// again from the run's stored feed. Ending quietly, as for another
// attempt, left nobody feeding until the reconciler's next pass.
func (f *feeder) rolledBack(ctx context.Context, theirs int) error {
	Logger(ctx).Warn("mapreduce: Redis lost the split's last feeds (restarted from a file that missed them); a new split task goes on from what it kept",
		"fed", f.fed, "redis_fed", theirs)
	if err := f.handOnFrom(ctx, 0); err != nil {
		return err
	}
	return errHandedOff
}

// errSplitTaken stops a feeder that finds another attempt of its split
// feeding pages past its own (feed.lua's check of the fed mark).
var errSplitTaken = errors.New("mapreduce: another attempt of the split is feeding the run")

// handOff records that every page below fed is enqueued and enqueues a
// new split task that goes on from there, so that this one can end.
func (f *feeder) handOff(ctx context.Context) error {
	if err := f.handOnFrom(ctx, f.fed); err != nil {
		return err
	}
	Logger(ctx).Info("mapreduce: split handed over to a new split task", "from_page", f.fed)
	return errHandedOff
}

// handOnFrom enqueues a new split task that goes on from page resume, or
// from the run's resume mark if further ("0": the mark).
func (f *feeder) handOnFrom(ctx context.Context, resume int) error {
	if err := f.c.handOn(ctx, f.k, f.run, f.nonce, resume, f.o); err != nil {
		if errors.Is(err, errRunGone) {
			return err
		}
		return fmt.Errorf("mapreduce: split of %s: %w", f.run, err)
	}
	return nil
}

// handOn enqueues a new split task for a splitting run, under a name no
// split task of the run had (ledger.handOn), that starts at page resume
// (or where the run's resume mark is, if further). The reconciler does the
// same for a run whose split task ended without ending the split.
func (c *Client) handOn(ctx context.Context, k runKeys, runID, nonce string, resume int, o JobOptions) error {
	step, err := c.ledger.handOn(ctx, k, nonce, resume)
	if err != nil {
		return err
	}
	return c.enqueueStepAs(ctx, runID, nonce, typeSplit, step, o)
}

// enqueuePages enqueues the map tasks of pages (ascending), packed as pack
// says, EnqueueConcurrency at a time, and returns the first error.
func (c *Client) enqueuePages(ctx context.Context, runID, nonce string, pages []fedPage, o JobOptions, pack packing) error {
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	slots := make(chan struct{}, c.cfg.EnqueueConcurrency)
	var wg sync.WaitGroup
	for _, t := range pack.tasks(pages) {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.enqueueMap(ctx, runID, nonce, t, o); err != nil {
				abort(err)
			}
			<-slots
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}
