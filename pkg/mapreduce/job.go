package mapreduce

import (
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"regexp"
	"time"
)

// Job is a MapReduce job: a name and three functions over plain Go values.
// A is the run's arguments, P a page descriptor, R a page's result and O the
// run's result. Each travels encoded (JSON unless Codec is set), so all four
// must survive an encode/decode round trip.
type Job[A, P, R, O any] struct {
	// Name identifies the job in run IDs, Redis keys and logs: 1 to 100
	// characters from [A-Za-z0-9_.-].
	Name string

	// Split streams the run's pages by calling emit once per page, in a
	// deterministic order: page i must be the same page each time Split
	// runs from the start (a retry after it failed part-way, say).
	//
	// emit hands the page to the run's window, which enqueues its map task
	// in a batch with the pages emitted beside it; it blocks while the
	// window (JobOptions.Window) is full, so a run of ten million pages
	// holds only a window of tasks in Redis, and Split runs, emitting as
	// pages are recorded, for most of the run. emit returns an error when
	// a page could not be enqueued, the run was cancelled (ErrRunCancelled)
	// or the split was handed on; Split should then return that error. Call
	// emit from Split's own goroutine: the order of the calls numbers the
	// pages.
	//
	// A split that has waited for room and runs past half its SplitTimeout
	// hands on to a new split task, which calls Split again (SplitTimeout
	// still bounds Split's own work); a retried split does the same. A
	// Split that resumes from a cursor (ResumeSplit, SetSplitCursor) goes
	// on after the last page fed; any other runs from the start, and the
	// pages already fed are skipped by position, without being enqueued
	// again. A retry that emits pages past those of an earlier attempt
	// that were already recorded fails the run, saying so.
	Split func(ctx context.Context, args A, emit func(page P) error) error

	// Map processes one page. It runs at least once per page, possibly
	// more (a retry after an error, a worker crash, a duplicate delivery),
	// and possibly concurrently with itself: it must be idempotent. Its
	// result is recorded exactly once. Results should be small; write large
	// outputs to your own store and return a reference.
	Map func(ctx context.Context, page P) (R, error)

	// Reduce combines the run's pages, in page order: each page's result,
	// or, for a page that failed for good, its error. It starts only once
	// every page is recorded, and a run records exactly one Reduce outcome.
	// Under SuccessSemantics it is not called when a page failed. It may
	// be nil: the run then succeeds with no result once every page is
	// recorded.
	Reduce func(ctx context.Context, args A, pages iter.Seq2[PageResult[P, R], error]) (O, error)

	// Validate checks a run's arguments before the run is created: Start
	// returns its error wrapped in ErrInvalidArgs, and nothing is written.
	// A start from the command line (Client.StartJSON) has it run by a live
	// worker hosting the job; the split runs it again before any page, so
	// that a run created past it fails at once, without retries. Nil: every
	// value of A is valid. The bounds, enums and required fields of A's
	// jsonschema tags are checked before it, wherever it runs, and by the
	// scheduler with no worker live (docs/mapreduce.md, "A run's
	// arguments").
	Validate func(args A) error

	// Options tunes how the job runs; the zero value is usable.
	Options JobOptions
}

// PageResult is one page's outcome, as Reduce sees it.
type PageResult[P, R any] struct {
	Index  int   // the page's position in the split, from 0
	Result R     // Map's result; the zero value if the page failed
	Err    error // the last error of a page that failed for good, or nil
	Page   P     // the page descriptor; set for failed pages only (not for one whose task was lost)
}

// Semantics says what a run does when pages fail for good.
type Semantics int

const (
	// SuccessSemantics (the default): a run succeeds only if every page
	// succeeds. If any page failed, Reduce is not called and the run fails
	// with an error naming the failed pages.
	SuccessSemantics Semantics = iota
	// CompleteSemantics: a run reduces over whatever succeeded once every
	// page has either succeeded or failed for good; Reduce sees the
	// failures and decides.
	CompleteSemantics
)

// JobOptions tunes a job. Zero values take the documented defaults.
type JobOptions struct {
	// Queue is the asynq queue of the job's tasks. Default: the job's own
	// queue, "<Config.Prefix>:<Name>", so that a task of the job only ever
	// reaches workers that host it. Jobs that set the same Queue share it;
	// a task that reaches a worker without its job is handed back
	// (Client.IsFailure), never failing its run.
	Queue string
	// MapRetries is how many times a failing page is retried before it
	// fails for good. Default 3; a negative value means no retries.
	MapRetries int
	// MapTimeout bounds one Map call. Default 30 minutes. asynq counts
	// timeouts in whole seconds: at least 1s, rounded up.
	MapTimeout time.Duration
	// SplitTimeout bounds one Split call. Default 1 hour.
	SplitTimeout time.Duration
	// ReduceTimeout bounds one Reduce call. Default 1 hour.
	ReduceTimeout time.Duration
	// Backoff is how long a failed task of the job waits before retry n
	// (n counts from 0), when the worker's asynq.Config.RetryDelayFunc is
	// Client.RetryDelay. Default: asynq.DefaultRetryDelayFunc, the
	// Sidekiq-style n⁴+15 s with jitter.
	Backoff func(n int, err error) time.Duration
	// StepRetries is how many times a failing Split or Reduce is retried
	// before the run fails. Default 3; a negative value means no retries.
	StepRetries int
	// TransientRetries is how many times a task retries an error that
	// IsTransient reports — the database or Redis briefly unreachable, a
	// failover, too many connections, a serialization failure — before
	// such errors count against MapRetries or StepRetries. These retries
	// spend none of the job's own. Default 30, which with the default
	// TransientBackoff rides out two to four minutes of outage; a negative
	// value means none (every error counts).
	TransientRetries int
	// TransientBackoff is how long a task waits before its transient retry
	// n (from 0). Default: 1s doubling to 10s, each a random wait between
	// half and all of it, so that a task resumes within about 10s of the
	// end of an outage and the fleet does not come back all at once.
	TransientBackoff func(n int) time.Duration
	// Semantics says what a run does when pages fail for good. Default
	// SuccessSemantics.
	Semantics Semantics
	// AllowOverlap lets a run start while another run of the job is still
	// active. By default Start refuses with ErrRunActive.
	AllowOverlap bool
	// Retention is how long a finished run's status and results stay
	// readable before Redis expires them. Default 24 hours.
	Retention time.Duration
	// Codec encodes arguments, pages, results and the run's result.
	// Default JSON.
	Codec Codec
	// Window is how many pages of a run may be enqueued or in flight at
	// once: Split's emit blocks while the window is full, and enqueues
	// more as pages are recorded. It bounds the Redis memory of a live
	// run's tasks (about 600 bytes a task, plus its pages' descriptors)
	// whatever the run's size, and lets a run started behind a large one
	// go first. Default 10,000. Keep it above the job's total worker
	// concurrency times the pages a task carries (up to PagesPerTask, for
	// a run that packs), or some workers will idle.
	Window int
	// PagesPerTask is the most pages one map task may carry. A run's
	// split measures how long Map takes; once a sample of pages is
	// recorded, it packs the pages it enqueues from then on into tasks
	// of about 2 ms of Map each, so that pages that take microseconds (an
	// in-memory step, a cache lookup) do not pay asynq's per-task cost
	// each, about 100–300 µs of CPU. Pages whose Map averages 1 ms or more
	// over that sample (typically a database query) keep a task each; a
	// run that packs keeps packing to its end. A task carries at most a
	// quarter of Window too. Each page of a packed task still gets its own
	// Map call, context (PageIndex), MapTimeout, result and failure; the
	// pages of a task run one after another, a failed page retries with
	// its task, sharing its retries, and the pages that succeeded are not
	// run again. Default 64, the most; a power of two; 1 turns packing off.
	PagesPerTask int
	// MaxArgsBytes is the most bytes a run's encoded arguments may take:
	// Start and StartJSON refuse larger ones with an error wrapping
	// ErrInvalidArgs, and create nothing. A run keeps its arguments in
	// Redis until its retention ends; pass a reference to large input (a
	// table, object storage). Default DefaultMaxArgsBytes (1 MiB); at
	// most 32 MiB.
	MaxArgsBytes int
}

// Codec encodes the values a job passes between processes.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// JSON is the default Codec.
var JSON Codec = jsonCodec{}

var jobNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,100}$`)

func (o JobOptions) withDefaults() JobOptions {
	if o.MapRetries == 0 {
		o.MapRetries = 3
	} else if o.MapRetries < 0 {
		o.MapRetries = 0
	}
	if o.StepRetries == 0 {
		o.StepRetries = 3
	} else if o.StepRetries < 0 {
		o.StepRetries = 0
	}
	if o.TransientRetries == 0 {
		o.TransientRetries = defaultTransientRetries
	} else if o.TransientRetries < 0 {
		o.TransientRetries = 0
	}
	if o.TransientBackoff == nil {
		o.TransientBackoff = defaultTransientBackoff
	}
	if o.MapTimeout == 0 {
		o.MapTimeout = 30 * time.Minute
	}
	if o.SplitTimeout == 0 {
		o.SplitTimeout = time.Hour
	}
	if o.ReduceTimeout == 0 {
		o.ReduceTimeout = time.Hour
	}
	if o.Retention == 0 {
		o.Retention = 24 * time.Hour
	}
	// asynq keeps timeouts and retention in whole seconds, truncated.
	o.MapTimeout, o.SplitTimeout, o.ReduceTimeout = ceilSecond(o.MapTimeout), ceilSecond(o.SplitTimeout), ceilSecond(o.ReduceTimeout)
	o.Retention = ceilSecond(o.Retention)
	if o.Codec == nil {
		o.Codec = JSON
	}
	if o.Window == 0 {
		o.Window = defaultWindow
	}
	if o.PagesPerTask == 0 {
		o.PagesPerTask = maxPack
	}
	if o.MaxArgsBytes == 0 {
		o.MaxArgsBytes = DefaultMaxArgsBytes
	}
	return o
}

func (o JobOptions) validate() error {
	switch {
	case o.MapTimeout < 0, o.SplitTimeout < 0, o.ReduceTimeout < 0:
		return fmt.Errorf("a timeout is negative: leave it zero for the default")
	case o.MapTimeout > 0 && o.MapTimeout < time.Second, o.SplitTimeout > 0 && o.SplitTimeout < time.Second,
		o.ReduceTimeout > 0 && o.ReduceTimeout < time.Second:
		return fmt.Errorf("a timeout is below 1s: asynq counts task timeouts in whole seconds (a shorter one means none): use at least 1s")
	case o.Retention < 0:
		return fmt.Errorf("negative Retention %v: leave it zero for the default (24h)", o.Retention)
	case o.Retention > 0 && o.Retention < time.Second:
		return fmt.Errorf("a Retention of %v is too short to read a finished run: use at least 1s", o.Retention)
	case o.Window < 0:
		return fmt.Errorf("negative Window %d: leave it zero for the default (%d pages)", o.Window, defaultWindow)
	case o.PagesPerTask < 0 || o.PagesPerTask > maxPack || o.PagesPerTask&(o.PagesPerTask-1) != 0:
		return fmt.Errorf("PagesPerTask %d: use a power of two up to %d (1 turns packing off), or leave it zero for the default (%d)", o.PagesPerTask, maxPack, maxPack)
	case o.MaxArgsBytes < 0 || o.MaxArgsBytes > maxArgsBytes:
		return fmt.Errorf("MaxArgsBytes %d: use at most %d (%s), or leave it zero for the default (%d, %s)", o.MaxArgsBytes, maxArgsBytes, mib(maxArgsBytes), DefaultMaxArgsBytes, mib(DefaultMaxArgsBytes))
	case o.Semantics != SuccessSemantics && o.Semantics != CompleteSemantics:
		return fmt.Errorf("unknown Semantics %d: use SuccessSemantics or CompleteSemantics", o.Semantics)
	}
	return nil
}

func ceilSecond(d time.Duration) time.Duration {
	return (d + time.Second - 1) / time.Second * time.Second
}

// check reports what makes the job unusable: a bad name or bad options.
func (j Job[A, P, R, O]) check() error {
	if !jobNameRE.MatchString(j.Name) {
		return fmt.Errorf("job name %q is invalid: use 1 to 100 characters from [A-Za-z0-9_.-]", j.Name)
	}
	if err := j.Options.validate(); err != nil {
		return fmt.Errorf("job %q: %w", j.Name, err)
	}
	if c := j.Options.Codec; c == nil || c == JSON {
		for _, v := range []struct {
			what string
			t    reflect.Type
		}{
			{"argument type", reflect.TypeFor[A]()}, {"page type", reflect.TypeFor[P]()},
			{"result type", reflect.TypeFor[R]()}, {"run result type", reflect.TypeFor[O]()},
		} {
			if why := notJSON(v.t); why != "" {
				return fmt.Errorf("job %q: its %s %v %s", j.Name, v.what, v.t, why)
			}
		}
		if err := argsSchemaOf(reflect.TypeFor[A]()).err; err != nil {
			return fmt.Errorf("job %q: its argument type's %w", j.Name, err)
		}
	}
	return nil
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// notJSON says why values of t cannot travel between processes as JSON
// (silently: encoding/json would drop them or fail only once decoding), or
// "" if they can, as far as t's type tells.
func notJSON(t reflect.Type) string {
	pointer := t.Kind() == reflect.Pointer
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Implements(jsonMarshaler) || t.Implements(textMarshaler) {
		return ""
	}
	if pt := reflect.PointerTo(t); pt.Implements(jsonMarshaler) || pt.Implements(textMarshaler) {
		if pointer {
			return ""
		}
		// encoding/json calls a pointer's method only on an addressable
		// value, which the value a job hands it is not: big.Int encodes
		// as {}.
		return "marshals itself only through a pointer (its MarshalJSON or MarshalText has a pointer receiver), which JSON does not call on a value: use *" + t.String() + " instead"
	}
	switch t.Kind() {
	case reflect.Interface:
		if t.NumMethod() == 0 {
			return "" // any: decoded as maps, slices and float64s
		}
		return "is an interface type, which JSON cannot decode into: use a concrete type, or a Codec of your own"
	case reflect.Struct:
		if t.NumField() == 0 {
			return "" // struct{}: no arguments, say
		}
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() || f.Anonymous {
				return ""
			}
		}
		return "has no exported fields: JSON encodes it as {} and every value would arrive zero; export its fields, or give it MarshalJSON and UnmarshalJSON"
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Complex64, reflect.Complex128:
		return "cannot be encoded as JSON: use another type, or a Codec of your own"
	}
	return ""
}

// validate checks decoded arguments against their type's jsonschema tags
// (JSON codec: their encoding is what the tags describe), then runs
// Validate.
func (j Job[A, P, R, O]) validate(a A) error {
	if err := j.checkTags(a); err != nil {
		return fmt.Errorf("%w for job %q: %w", ErrInvalidArgs, j.Name, err)
	}
	if j.Validate == nil {
		return nil
	}
	if err := j.Validate(a); err != nil {
		return fmt.Errorf("%w for job %q: %w", ErrInvalidArgs, j.Name, err)
	}
	return nil
}

// Start creates a run of the job with args and enqueues its split; any
// worker hosting the job (a process that registered it with AddJob, such
// as one started with the worker package) runs it. The process calling
// Start needs none of the job's dependencies: only c's Redis.
//
// It returns the run ID. Arguments that Validate rejects, or that take more
// than JobOptions.MaxArgsBytes encoded, give an error wrapping
// ErrInvalidArgs, and nothing is created. If a run with the same
// ID exists, Start returns that ID and an error wrapping ErrRunExists; if
// the job forbids overlap and another run is active, an error wrapping
// ErrRunActive that names it.
func (j Job[A, P, R, O]) Start(ctx context.Context, c *Client, args A, opts StartOptions) (string, error) {
	if err := j.check(); err != nil {
		return "", fmt.Errorf("mapreduce: start: %w", err)
	}
	if err := j.validate(args); err != nil {
		return "", fmt.Errorf("mapreduce: start %q: %w", j.Name, err)
	}
	o := j.Options.withDefaults()
	b, err := o.Codec.Marshal(args)
	if err != nil {
		return "", fmt.Errorf("mapreduce: start %q: encoding the arguments: %w", j.Name, err)
	}
	if err := checkArgsSize(o, len(b)); err != nil {
		return "", fmt.Errorf("mapreduce: start %q: %w", j.Name, err)
	}
	return c.start(ctx, c.spec(j.Name, o), b, opts)
}

// Result decodes the result of a succeeded run of the job. It returns an
// error if the run is not the job's, has not succeeded, or its result does
// not decode into O.
func (j Job[A, P, R, O]) Result(st *Status) (O, error) {
	var o O
	switch {
	case st == nil:
		return o, fmt.Errorf("mapreduce: result of job %q: nil Status", j.Name)
	case st.Job != j.Name:
		return o, fmt.Errorf("mapreduce: result of %s: the run is of job %q, not %q", st.ID, st.Job, j.Name)
	case st.State != StateSucceeded:
		return o, fmt.Errorf("mapreduce: result of %s: the run has not succeeded (state %s%s)", st.ID, st.State, suffix(": ", st.Error))
	}
	if err := j.Options.withDefaults().Codec.Unmarshal(st.Result, &o); err != nil {
		return o, fmt.Errorf("mapreduce: result of %s: decoding it into %v: %w", st.ID, reflect.TypeFor[O](), err)
	}
	return o, nil
}

func suffix(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

// AnyJob is a Job of any type parameters, for the places that take jobs of
// different types together, such as worker.Main. Only Job implements it.
type AnyJob interface {
	// JobName returns the job's Name.
	JobName() string
	addTo(jobs *Jobs) error
}

// JobName returns the job's Name.
func (j Job[A, P, R, O]) JobName() string { return j.Name }

func (j Job[A, P, R, O]) addTo(jobs *Jobs) error { return AddJob(jobs, j) }

var _ AnyJob = Job[int, int, int, int]{}

// Add registers a job of any type in j, as AddJob does.
func (j *Jobs) Add(job AnyJob) error {
	if job == nil {
		return errors.New("mapreduce: Jobs.Add: nil job")
	}
	return job.addTo(j)
}
