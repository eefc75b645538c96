package mapreduce

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/batchmr/batchmr/internal/argschema"
)

// Jobs is a registry of jobs, shared by the processes that start runs and
// the workers that run them. Build it once at start-up with AddJob.
type Jobs struct {
	mu     sync.RWMutex
	byName map[string]jobRunner
}

// NewJobs returns an empty registry.
func NewJobs() *Jobs {
	return &Jobs{byName: map[string]jobRunner{}}
}

// AddJob registers job in jobs. It returns an error if the job is invalid
// (a bad name, a missing Split or Map, bad options) or its name is taken.
func AddJob[A, P, R, O any](jobs *Jobs, job Job[A, P, R, O]) error {
	if jobs == nil {
		return errors.New("mapreduce: AddJob: nil Jobs: create one with NewJobs")
	}
	if err := job.check(); err != nil {
		return fmt.Errorf("mapreduce: AddJob: %w", err)
	}
	if job.Split == nil || job.Map == nil {
		return fmt.Errorf("mapreduce: AddJob: job %q needs both Split and Map (Reduce is optional)", job.Name)
	}
	job.Options = job.Options.withDefaults()
	jobs.mu.Lock()
	defer jobs.mu.Unlock()
	if _, dup := jobs.byName[job.Name]; dup {
		return fmt.Errorf("mapreduce: AddJob: a job named %q is already registered", job.Name)
	}
	jobs.byName[job.Name] = &typedJob[A, P, R, O]{job}
	return nil
}

func (j *Jobs) lookup(name string) (jobRunner, bool) {
	if j == nil {
		return nil, false
	}
	j.mu.RLock()
	defer j.mu.RUnlock()
	r, ok := j.byName[name]
	return r, ok
}

// Names returns the registered job names, sorted.
func (j *Jobs) Names() []string {
	if j == nil {
		return nil
	}
	j.mu.RLock()
	defer j.mu.RUnlock()
	names := make([]string, 0, len(j.byName))
	for n := range j.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// jobRunner is a Job with its types erased: what the task handlers need.
type jobRunner interface {
	name() string
	options() JobOptions
	// checkArgs decodes encoded arguments strictly and runs Validate.
	checkArgs(args []byte) error
	info() JobInfo
	split(ctx context.Context, args []byte, emit func(page []byte) error) error
	mapPage(ctx context.Context, page []byte) ([]byte, error)
	hasReduce() bool
	reduce(ctx context.Context, args []byte, pages iter.Seq2[storedPage, error]) ([]byte, error)
}

// storedPage is one recorded page as Redis holds it.
type storedPage struct {
	index   int
	result  []byte   // set if the page succeeded
	failure *failure // set if it failed for good
}

// failure is a page that failed for good: its descriptor and last error.
type failure struct {
	Page  []byte `json:"page"`
	Error string `json:"error"`
}

type typedJob[A, P, R, O any] struct{ Job[A, P, R, O] }

func (j *typedJob[A, P, R, O]) name() string        { return j.Name }
func (j *typedJob[A, P, R, O]) options() JobOptions { return j.Options }
func (j *typedJob[A, P, R, O]) hasReduce() bool     { return j.Reduce != nil }

func (j *typedJob[A, P, R, O]) checkArgs(b []byte) error {
	_, err := j.checkedArgs(b)
	return err
}

// checkedArgs decodes encoded arguments strictly and runs Validate: a
// field the job's argument type lacks is an error, not dropped, so that
// arguments meant for another version of the job fail its run instead of
// running it with zero values.
func (j *typedJob[A, P, R, O]) checkedArgs(b []byte) (A, error) {
	var a A
	if err := decodeStrict(j.Options.Codec, b, &a); err != nil {
		return a, fmt.Errorf("%w: %.200q do not fit job %q's argument type %v: %w", ErrInvalidArgs, b, j.Name, reflect.TypeFor[A](), err)
	}
	// A field its tag requires is told from a zero value only here, where
	// the arguments are as written.
	if c := j.Options.Codec; c == nil || c == JSON {
		if s := argsSchemaOf(reflect.TypeFor[A]()); s.constrained && s.err == nil {
			if err := argschema.Check(s.json, b); err != nil {
				return a, fmt.Errorf("%w for job %q: %w", ErrInvalidArgs, j.Name, err)
			}
		}
	}
	return a, j.validate(a)
}

func (j *typedJob[A, P, R, O]) decodeArgs(b []byte) (A, error) {
	var a A
	if err := j.Options.Codec.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("decoding the arguments of job %q: %w", j.Name, err)
	}
	return a, nil
}

func (j *typedJob[A, P, R, O]) split(ctx context.Context, args []byte, emit func([]byte) error) (err error) {
	defer recovered("Split", &err)
	// Arguments that got past Start unchecked (no worker answered the
	// check of a command-line start, or Start ran another version of the
	// job's code) fail the run here, before any page.
	a, err := j.checkedArgs(args)
	if err != nil {
		return &malformedError{err}
	}
	return j.Split(ctx, a, func(p P) error {
		b, err := j.Options.Codec.Marshal(p)
		if err != nil {
			return fmt.Errorf("encoding a page of job %q: %w", j.Name, err)
		}
		return emit(b)
	})
}

func (j *typedJob[A, P, R, O]) mapPage(ctx context.Context, page []byte) (_ []byte, err error) {
	defer recovered("Map", &err)
	var p P
	if err := j.Options.Codec.Unmarshal(page, &p); err != nil {
		return nil, &malformedError{fmt.Errorf("decoding a page of job %q: %w", j.Name, err)}
	}
	r, err := j.Map(ctx, p)
	if err != nil {
		return nil, err
	}
	b, err := j.Options.Codec.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding a result of job %q: %w", j.Name, err)
	}
	return b, nil
}

func (j *typedJob[A, P, R, O]) reduce(ctx context.Context, args []byte, pages iter.Seq2[storedPage, error]) (_ []byte, err error) {
	defer recovered("Reduce", &err)
	a, err := j.decodeArgs(args)
	if err != nil {
		return nil, err
	}
	typed := func(yield func(PageResult[P, R], error) bool) {
		for sp, err := range pages {
			var pr PageResult[P, R]
			pr.Index = sp.index
			if err == nil {
				if sp.failure != nil {
					pr.Err = errors.New(sp.failure.Error)
					if len(sp.failure.Page) == 0 {
						// A page whose task was lost: its descriptor went with it.
					} else if uerr := j.Options.Codec.Unmarshal(sp.failure.Page, &pr.Page); uerr != nil {
						err = fmt.Errorf("decoding failed page %d of job %q: %w", sp.index, j.Name, uerr)
					}
				} else if uerr := j.Options.Codec.Unmarshal(sp.result, &pr.Result); uerr != nil {
					err = fmt.Errorf("decoding the result of page %d of job %q: %w", sp.index, j.Name, uerr)
				}
			}
			if !yield(pr, err) || err != nil {
				return
			}
		}
	}
	o, err := j.Reduce(ctx, a, typed)
	if err != nil {
		return nil, err
	}
	b, err := j.Options.Codec.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("encoding the result of job %q: %w", j.Name, err)
	}
	return b, nil
}

// recovered turns a panic of a job's function fn into *err, deferred: the
// step then fails as if fn had returned the error, so it is retried,
// recorded as failed on its last attempt, logged and observed like any
// failure. Left to asynq, the panic became an error only after the
// handler's own bookkeeping had unwound: the page was never recorded as
// failed and observers counted a success.
func recovered(fn string, err *error) {
	if p := recover(); p != nil {
		*err = &PanicError{Func: fn, Value: p, At: panicSite()}
	}
}

// PanicError is the error of a Split, Map or Reduce that panicked.
type PanicError struct {
	Func  string // "Split", "Map" or "Reduce"
	Value any    // what it panicked with
	At    string // file:line of the panic, "" if unknown
}

func (e *PanicError) Error() string {
	if e.At == "" {
		return fmt.Sprintf("%s panicked: %v", e.Func, e.Value)
	}
	return fmt.Sprintf("%s panicked at %s: %v", e.Func, e.At, e.Value)
}

// panicSite returns the file:line a panic being recovered was raised at:
// the first frame outside the runtime above recovered.
func panicSite() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") && f.File != "" {
			return filepath.Base(f.File) + ":" + strconv.Itoa(f.Line)
		}
		if !more {
			return ""
		}
	}
}

// malformedError marks input that no retry can fix.
type malformedError struct{ err error }

func (e *malformedError) Error() string { return e.err.Error() }
func (e *malformedError) Unwrap() error { return e.err }

func decodeStrict(c Codec, data []byte, v any) error {
	if c != JSON {
		return c.Unmarshal(data, v)
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}
