package mapreduce

import (
	"strconv"
	"strings"
	"time"
)

// State is where a run is in its life.
type State string

// A run moves splitting → mapping → reducing → succeeded, and may end
// failed or cancelled from any unfinished state. Retry takes a failed or
// cancelled run back to splitting.
const (
	StateSplitting State = "splitting" // Split is enqueuing pages; the total is not known yet
	StateMapping   State = "mapping"   // every page is enqueued; pages are being processed
	StateReducing  State = "reducing"  // every page is recorded; Reduce runs
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
)

// Ended reports whether the run is over: succeeded, failed or cancelled.
func (s State) Ended() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// Status is a snapshot of a run.
type Status struct {
	ID    string
	Job   string
	State State
	// Total is the number of pages, or -1 while the split is running.
	Total int
	// Expected is the number of pages the run's Split said it would emit
	// (ExpectPages), or -1 if it said nothing. Progress shown before the
	// total is known uses it (Pages).
	Expected int
	// Done and Failed count recorded pages: succeeded, and failed for good.
	// Retry forgets the failed pages, to run them again: Failed restarts
	// from 0.
	Done, Failed int
	// InFlight is, while the run is splitting, how much of its window is
	// in use: pages the split has made room for and that are not recorded
	// yet, at most JobOptions.Window. It can exceed what is enqueued while
	// the split emits (room is made a batch at a time) and near the end of
	// a run (room made for pages past its last). Zero once the split has
	// ended.
	InFlight int
	// PagesPerTask is the most pages a map task of the run carries from
	// page PackedFrom on (docs/mapreduce.md, "Packing"); 1, with
	// PackedFrom 0, while the run gives each page a task of its own.
	PagesPerTask, PackedFrom int
	// MapAverage is how long Map took on average over the pages whose
	// Map succeeded, earlier attempts included, in whole microseconds
	// (zero before any, or under 1µs): what the split packs by.
	MapAverage time.Duration
	// Created is when Start created the run, SplitDone when the split had
	// enqueued every page, Updated when the run last changed, and Finished
	// when it ended; zero until then. A Retry zeroes SplitDone and Finished
	// until the resumed run gets there again.
	Created, SplitDone, Updated, Finished time.Time
	// Retries counts the times Retry resumed the run, and Retried is when
	// it last did; zero if it never did.
	Retries int
	Retried time.Time
	// RetriedDone is Done as the last Retry left it: the pages it kept,
	// which Rate does not count. -1 if the record does not say for the
	// last Retry (something other than batchmr changed it).
	RetriedDone int
	// Error says why a failed run failed, or that it was cancelled: its
	// first 4 KiB.
	Error string
	// LastError is the latest failed attempt of one of the run's steps
	// (a page, the split or the reduce) since Start or the last Retry,
	// retried or not: while the run goes on, why it does not progress (a
	// split that fails and retries shows nothing else). Zero if none.
	LastError StepError
	// Result is the encoded value Reduce returned (JSON unless the job has
	// another Codec): decode it with the job's Job.Result.
	Result []byte
	// Args are the run's arguments as Start stored them (JSON unless the
	// job has another Codec).
	Args []byte
	// ArgsBytes and ResultBytes are the sizes of the arguments and the
	// result in bytes, also where StatusUpTo left them out. Runs and
	// ActiveRuns read neither: all four are zero there.
	ArgsBytes, ResultBytes int

	nonce     string // part of the run's task IDs
	splitTask string // the last part of the ID of the run's split task
	resume    int    // while splitting: every page below it was enqueued
	pack      packing
}

func parseStatus(runID string, h map[string]string) *Status {
	st := &Status{
		ID:        runID,
		Job:       h["job"],
		State:     State(h["state"]),
		Total:     atoi(h["total"]),
		Done:      atoi(h["done"]),
		Failed:    atoi(h["failed"]),
		Retries:   atoi(h["retries"]),
		Error:     h["error"],
		nonce:     h["nonce"],
		splitTask: h["split_task"],
		resume:    atoi(h["resume"]),
	}
	st.PagesPerTask = 1
	if k := atoi(h["pack"]); k > 1 {
		st.pack = packing{k: k, from: atoi(h["pack_from"])}
		st.PagesPerTask, st.PackedFrom = k, st.pack.from
	}
	if n := atoi(h["map_n"]); n > 0 {
		st.MapAverage = time.Duration(atoi(h["map_us"])/n) * time.Microsecond
	}
	st.Expected = -1
	if e, err := strconv.Atoi(h["expected"]); err == nil {
		st.Expected = e
	}
	if st.State == StateSplitting {
		st.InFlight = max(atoi(h["fed"])-atoi(h["fed_done"]), 0)
	}
	if st.splitTask == "" {
		st.splitTask = "split"
	}
	if r, ok := h["result"]; ok {
		st.Result = []byte(r)
	}
	if a, ok := h["args"]; ok {
		st.Args = []byte(a)
	}
	st.Created = msTime(h["created"])
	st.SplitDone = msTime(h["split_done"])
	st.Updated = msTime(h["updated"])
	st.Finished = msTime(h["finished"])
	st.Retried = msTime(h["retried"])
	if e := h["last_error"]; e != "" {
		st.LastError = StepError{Step: h["last_error_step"], Error: e, At: msTime(h["last_error_at"])}
	}
	st.RetriedDone = -1
	if st.Retries == 0 {
		st.RetriedDone = 0
	} else if of, n, ok := strings.Cut(h["retried_done"], ":"); ok && of == strconv.Itoa(st.Retries) {
		st.RetriedDone = atoi(n)
	}
	return st
}

// StepError is a failed attempt of a run's step.
type StepError struct {
	// Step is "split", "reduce" or "page N".
	Step string
	// Error is the attempt's error, shortened to 500 bytes.
	Error string
	// At is when it failed, in Redis's time.
	At time.Time
}

// Rate returns the pages per second the run has recorded, done or failed,
// since Start created it or Retry last resumed it, up to when it ended or
// now (in Redis's time, as Created and Retried are); the pages a Retry
// kept from before (RetriedDone) are not counted. ok is false while no
// page has been recorded since then, and while RetriedDone is not known.
func (st *Status) Rate(now time.Time) (perSecond float64, ok bool) {
	if st.RetriedDone < 0 {
		return 0, false
	}
	start, end := st.Created, now
	if !st.Retried.IsZero() {
		start = st.Retried
	}
	if !st.Finished.IsZero() {
		end = st.Finished
	}
	n := st.Done - st.RetriedDone + st.Failed
	if el := end.Sub(start).Seconds(); el > 0 && n > 0 {
		return float64(n) / el, true
	}
	return 0, false
}

// Remaining estimates how long the run needs to record its other pages at
// its Rate. ok is false once the run has ended, while neither its total
// nor the pages its Split said to expect are known, while Rate is not, and
// while the run is Stalled: a rate averaged over the run says nothing of
// a run that stopped moving.
func (st *Status) Remaining(now time.Time) (d time.Duration, ok bool) {
	total, known := st.Pages()
	r, rated := st.Rate(now)
	left := total - st.Done - st.Failed
	if _, stalled := st.Stalled(now); st.State.Ended() || !known || !rated || left <= 0 || stalled {
		return 0, false
	}
	return time.Duration(float64(left) / r * float64(time.Second)), true
}

// stalledAfter is how long an active run may go without changing (a page
// recorded, a step begun or ended) before Stalled says so.
const stalledAfter = time.Minute

// Stalled returns how long a run whose pages are under way has gone
// without changing (its Updated: a page recorded, done or failed, or its
// state moved on) up to now, in Redis's time, and whether that is a
// minute or more. A run whose pages each take longer is stalled
// between them; otherwise its workers are stopped, failing (LastError), or
// waiting on something: a database that hangs shows only in its own
// activity (pg_stat_activity) and in the workers' /readyz. ok is false for
// a run that has ended, that reduces (a long Reduce records nothing), and
// that splits before its first page is recorded (a split's first query
// may take that long).
func (st *Status) Stalled(now time.Time) (idle time.Duration, ok bool) {
	switch {
	case st.State == StateMapping:
	case st.State == StateSplitting && st.Done+st.Failed > max(st.RetriedDone, 0):
	default:
		return 0, false
	}
	if st.Updated.IsZero() {
		return 0, false
	}
	idle = max(now.Sub(st.Updated), 0)
	return idle, idle >= stalledAfter
}

// ArgsRefused reports whether the run failed because its split found its
// arguments invalid: they do not fit the job's argument type, or its
// Validate refused them (a run started with no live worker to check them
// first). A Retry runs with the same arguments and fails the same way
// unless the job's code has changed since: a new run with other arguments
// is the fix.
func (st *Status) ArgsRefused() bool {
	return st.State == StateFailed && strings.HasPrefix(st.Error, argsRefusedPrefix(st.ID))
}

// argsRefusedPrefix starts the error of a run whose split found its
// arguments invalid.
func argsRefusedPrefix(runID string) string {
	return "mapreduce: split of " + runID + ": " + ErrInvalidArgs.Error()
}

// Pages returns the run's number of pages for showing its progress: its
// Total once known, else the pages its Split said to expect, and whether
// either is known.
func (st *Status) Pages() (int, bool) {
	switch {
	case st.Total >= 0:
		return st.Total, true
	case st.Expected >= 0:
		return st.Expected, true
	}
	return 0, false
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func msTime(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
