package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/drain"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/internal/shorten"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// The asynq task types of a run. Each task's ID is derived from the run
// (<run>:<nonce>:split, <run>:<nonce>:map:<index>, <run>:<nonce>:reduce,
// and <run>:<nonce>:pages:<first> for a task that carries several pages,
// pack.go), so enqueuing a task twice — a retried split, a duplicate
// reduce trigger — makes one task. The nonce is drawn when the run is created: a run started
// again under the same ID after the first one expired gets new task IDs,
// while asynq may still keep the first one's tasks.
const (
	// typePrefix starts every batchmr task type: Register routes by it,
	// and ServerConfig tells batchmr's tasks from a server's others by it.
	typePrefix = "batchmr:"
	typeSplit  = "batchmr:split"
	typeMap    = "batchmr:map"
	// typePages is a map task of several pages (pack.go).
	typePages  = "batchmr:pages"
	typeReduce = "batchmr:reduce"
)

// Register routes batchmr's task types to c on mux, for a worker that runs
// the jobs of c's Config.Jobs, on a server whose asynq.Config ServerConfig
// completed. A task of a type batchmr does not know, or with a
// malformed payload, is archived at once with an error saying why (asynq
// would retry what cannot succeed).
func (c *Client) Register(mux *asynq.ServeMux) {
	mux.HandleFunc(typeSplit, c.processTask)
	mux.HandleFunc(typeMap, c.processTask)
	mux.HandleFunc(typePages, c.processTask)
	mux.HandleFunc(typeReduce, c.processTask)
	mux.HandleFunc(typePrefix, c.processTask) // asynq routes by longest prefix
}

// DefaultPollInterval is how long an idle handler slot of a server that
// ServerConfig configures waits before it looks at its queues again,
// unless the config sets TaskCheckInterval: each step of a run that starts
// on idle workers waits up to about that. asynq's own default is a second.
const DefaultPollInterval = 100 * time.Millisecond

// ServerConfig returns cfg completed for an asynq server that runs c's
// jobs; pass it to asynq.NewServer (or NewServerFromRedisClient) and
// register c on the server's mux (Register). It sets:
//   - Queues, when cfg has none, to Queues(nil): every job's queue. Queues
//     of cfg's own must include them: a job whose queue the server does
//     not serve never runs, and ServerConfig returns an error naming it.
//   - RetryDelayFunc to RetryDelay, which applies each job's Backoff and
//     TransientBackoff. A function of cfg's own still decides for the
//     server's other tasks (a type that does not start with "batchmr:").
//   - IsFailure to IsFailure, so that a task handed back, or riding out
//     an outage, does not spend a retry. A function of cfg's own still
//     decides for the server's other tasks.
//   - TaskCheckInterval, when zero, to DefaultPollInterval.
//
// Without RetryDelay and IsFailure a run still works, but a database or
// Redis outage of a minute spends the job's retries and can fail the run.
func (c *Client) ServerConfig(cfg asynq.Config) (asynq.Config, error) {
	mine, err := c.Queues(nil)
	if err != nil {
		return cfg, err
	}
	if len(mine) == 0 {
		return cfg, errors.New("mapreduce: ServerConfig: this client runs no job, so a server would run nothing of batchmr's: pass the jobs in mapreduce.Config.Jobs")
	}
	if cfg.Queues == nil {
		cfg.Queues = mine
	} else if err := servesQueues(cfg.Queues, mine); err != nil {
		return cfg, err
	}
	if own := cfg.RetryDelayFunc; own != nil {
		cfg.RetryDelayFunc = func(n int, err error, t *asynq.Task) time.Duration {
			if strings.HasPrefix(t.Type(), typePrefix) {
				return c.RetryDelay(n, err, t)
			}
			return own(n, err, t)
		}
	} else {
		cfg.RetryDelayFunc = c.RetryDelay
	}
	if own := cfg.IsFailure; own != nil {
		// asynq gives IsFailure the error alone: batchmr's tasks' errors
		// are known by their wrapper (processTask), and only IsFailure
		// decides for them, so that the server's own function cannot
		// keep a job's retries from running out.
		cfg.IsFailure = func(err error) bool {
			if _, ok := errors.AsType[*taskError](err); ok {
				return c.IsFailure(err)
			}
			return own(err)
		}
	} else {
		cfg.IsFailure = c.IsFailure
	}
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = DefaultPollInterval
	}
	return cfg, nil
}

// servesQueues returns an error naming the queues of mine that queues, a
// server's asynq.Config.Queues, lacks or gives a weight below 1, which
// asynq drops.
func servesQueues(queues, mine map[string]int) error {
	var missing []string
	for _, q := range slices.Sorted(maps.Keys(mine)) {
		if w, ok := queues[q]; !ok || w < 1 {
			missing = append(missing, q)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("mapreduce: asynq.Config.Queues lacks %s, the queue(s) of this client's jobs, or gives them a weight below 1: their tasks would never run here; add them with a weight of at least 1, or leave Queues nil to serve Queues(nil)", strings.Join(missing, ", "))
	}
	return nil
}

// Queues returns the asynq queues of the jobs c runs, each with weight 1
// unless weights (by job name) says otherwise: the worker's
// asynq.Config.Queues. It returns an error for a weight below 1 or of a
// job c does not run.
func (c *Client) Queues(weights map[string]int) (map[string]int, error) {
	names := c.jobs.Names()
	for job, w := range weights {
		if !slices.Contains(names, job) {
			return nil, fmt.Errorf("mapreduce: queue weight of %q: this worker does not run that job (it runs: %s)", job, strings.Join(names, ", "))
		}
		if w < 1 {
			return nil, fmt.Errorf("mapreduce: queue weight %d of job %q: use at least 1", w, job)
		}
	}
	qs := map[string]int{}
	for _, job := range names {
		r, _ := c.jobs.lookup(job)
		w := max(weights[job], 1)
		q := c.options(r).Queue
		qs[q] = max(qs[q], w) // jobs sharing a queue share its weight
	}
	return qs, nil
}

// processTask runs one task of a run with a context whose Logger carries
// the task's attributes, and logs its failure (warn) or its end (debug).
func (c *Client) processTask(ctx context.Context, t *asynq.Task) error {
	ctx = ContextWithLogger(ctx, c.stepLogger(ctx, t))
	// A worker that stops drains its semaphores: a step that has not got
	// its first permit is refused one and handed back (transientRetry); a
	// step that has goes on to its end.
	ctx = drain.With(ctx)
	start := time.Now()
	var err error
	switch t.Type() {
	case typeSplit:
		err = c.handleSplit(ctx, t)
	case typeMap, typePages:
		err = c.handleMap(ctx, t)
	case typeReduce:
		err = c.handleReduce(ctx, t)
	default:
		err = fmt.Errorf("mapreduce: task type %q is not batchmr's (%s, %s, %s, %s): %w", t.Type(), typeSplit, typeMap, typePages, typeReduce, asynq.SkipRetry)
	}
	switch {
	case err == nil:
		Logger(ctx).LogAttrs(ctx, slog.LevelDebug, "mapreduce: "+stepName(t)+" done", slog.Duration("took", time.Since(start)))
		c.endOutages(t)
	case errors.Is(err, errStopping):
		Logger(ctx).Info("mapreduce: " + stepName(t) + " handed back: this worker is stopping, and it had not got its permit yet")
	case errors.Is(err, errElsewhere):
		c.logHandBack(ctx, t, err)
		c.noteError(ctx, t, err)
	case !errors.Is(err, errNotHosted):
		c.logAttempt(ctx, t, err)
		c.noteError(ctx, t, err)
	}
	c.awaitQueue(ctx)
	if err != nil {
		return &taskError{err}
	}
	return nil
}

// queueFailoverWindow is how long after a Cluster node failed a task
// checks that its queue's primary answers before it returns (awaitQueue).
const queueFailoverWindow = 30 * time.Second

// awaitQueue holds a task that has ended until its queue's primary
// answers, while a node of the Cluster has failed within
// queueFailoverWindow. asynq (v0.26) writes a task's outcome once, and its
// retries of that write reuse a context it has cancelled
// (docs/asynq-sync-retry.md): an outcome written while the queue's
// primary fails over is lost, and the task stays active until asynq's
// recoverer, a minute or two later. On one server or behind Sentinel the
// handler's own writes, on the same server as the queue, have waited for
// it already.
func (c *Client) awaitQueue(ctx context.Context) {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok || !rediserr.SlotsStaleWithin(cc, queueFailoverWindow) {
		return
	}
	queue, ok := asynq.GetQueueName(ctx)
	if !ok {
		return
	}
	pending := "asynq:{" + queue + "}:pending" // a key in the queue's slot
	_ = withRedis(ctx, c.outages, "waiting for the task's queue to answer", func(ctx context.Context) error {
		return cc.Exists(ctx, pending).Err()
	})
}

// taskError is the error of a task of batchmr's, as processTask returns
// it to asynq: ServerConfig's IsFailure knows batchmr's tasks by it.
type taskError struct{ err error }

func (e *taskError) Error() string { return e.err.Error() }
func (e *taskError) Unwrap() error { return e.err }

// lastErrorMax is how much of a step's error its run keeps (LastError).
const lastErrorMax = 500

// noteError notes err in task t's run as its LastError, waiting a second
// at most: it is for people watching, and an unreachable Redis must not
// hold the task.
func (c *Client) noteError(ctx context.Context, t *asynq.Task, err error) {
	var p mapPayload // split and reduce payloads are its first fields
	if json.Unmarshal(t.Payload(), &p) != nil {
		return
	}
	step := stepName(t)
	if t.Type() == typeMap || t.Type() == typePages {
		parts := p.parts()
		step = pagesName(parts[0].i, parts[len(parts)-1].i)
	}
	msg := shorten.To(err.Error(), lastErrorMax)
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = c.ledger.noteError(nctx, p.Run, p.Nonce, step, msg)
}

// handBackDelay is how long a task of a job this worker does not run waits
// before it is offered again, to this worker or another.
const handBackDelay = 5 * time.Second

// RetryDelay is an asynq.RetryDelayFunc that applies each job's
// JobOptions.Backoff to its tasks, and JobOptions.TransientBackoff to a
// task retrying a transient error; a task handed back because this worker
// does not run its job, or because its code returned an error wrapping
// ErrHandedBack, is offered again after 2.5–7.5 s; other tasks get
// asynq.DefaultRetryDelayFunc. ServerConfig sets it as the worker's
// asynq.Config.RetryDelayFunc.
func (c *Client) RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	if errors.Is(err, errNotHosted) || errors.Is(err, errElsewhere) {
		return handBackDelay/2 + rand.N(handBackDelay)
	}
	if errors.Is(err, errStopping) {
		return 0 // for the other workers to take at once
	}
	if tr, ok := errors.AsType[*errTransientRetry](err); ok {
		return tr.delay
	}
	var p runPayload // map payloads carry the run too
	if json.Unmarshal(t.Payload(), &p) == nil {
		if job, ok := jobOf(p.Run); ok {
			if r, ok := c.jobs.lookup(job); ok && r.options().Backoff != nil {
				return r.options().Backoff(n, err)
			}
		}
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// IsFailure is an asynq.Config.IsFailure that does not count a task handed
// back because this worker does not run its job, or is stopping before the
// task got its permit (semaphore.Drain), or its code returned an error
// wrapping ErrHandedBack, nor one retrying a transient
// error within JobOptions.TransientRetries: asynq then retries it without
// spending one of its retries. ServerConfig sets it as the worker's
// asynq.Config.IsFailure.
func (c *Client) IsFailure(err error) bool {
	if _, ok := errors.AsType[*errTransientRetry](err); ok {
		return false
	}
	return err != nil && !errors.Is(err, errNotHosted) && !errors.Is(err, errStopping) && !errors.Is(err, errElsewhere)
}

// errElsewhere marks a step whose code handed it back (an error wrapping
// ErrHandedBack): this worker cannot do it, another may.
var errElsewhere = fmt.Errorf("this worker cannot do the step, another may: %w", ErrHandedBack)

// errNotHosted marks a task of a job this worker does not run.
var errNotHosted = fmt.Errorf("this worker does not run the task's job: %w", ErrHandedBack)

// errStopping marks a task handed back because its worker is stopping
// before the task got the permit its work waited for.
var errStopping = fmt.Errorf("this worker is stopping: %w", ErrHandedBack)

// runPayload is the payload of split and reduce tasks. Nonce ties the task
// to one incarnation of the run ID: a task left over from an earlier run
// under the same ID (re-run from asynq's archive, say) does nothing.
type runPayload struct {
	Run   string `json:"run"`
	Nonce string `json:"n"`
}

// mapPayload is the payload of a map task: its first page, and in a task
// of several pages (typePages) the others in More, in index order. A page
// the codec encoded as JSON travels as JSON, readable in asynq's tools;
// any other bytes as base64.
type mapPayload struct {
	Run   string `json:"run"`
	Nonce string `json:"n"`
	pagePart
	More []pagePart `json:"more,omitempty"`
}

// pagePart is one page of a map task's payload.
type pagePart struct {
	Index     int             `json:"i"`
	Page      json.RawMessage `json:"page,omitempty"`
	PageBytes []byte          `json:"page_b,omitempty"` // may be empty: a codec may encode a page as no bytes
}

func (p *pagePart) page() []byte {
	if p.Page != nil {
		return p.Page
	}
	return p.PageBytes
}

// parts returns the pages of the task, in index order.
func (p *mapPayload) parts() []fedPage {
	pages := make([]fedPage, 0, 1+len(p.More))
	pages = append(pages, fedPage{i: p.Index, page: p.page()})
	for i := range p.More {
		pages = append(pages, fedPage{i: p.More[i].Index, page: p.More[i].page()})
	}
	return pages
}

// newPagePart is page i's part of a payload, as codec encoded it.
func newPagePart(i int, page []byte, codec Codec) pagePart {
	// Only JSON-encoded pages travel as JSON: encoding/json compacts and
	// escapes a RawMessage, which would change another codec's bytes.
	if codec == JSON {
		return pagePart{Index: i, Page: page}
	}
	return pagePart{Index: i, PageBytes: page}
}

func taskID(runID, nonce, step string) string { return runID + ":" + nonce + ":" + step }

func mapTaskID(runID, nonce string, i int) string {
	return runID + ":" + nonce + ":map:" + strconv.Itoa(i)
}

// pagesTaskID is the ID of the task of a pack's group that starts at page
// first (pack.go).
func pagesTaskID(runID, nonce string, first int) string {
	return runID + ":" + nonce + ":pages:" + strconv.Itoa(first)
}

// maxPages bounds a run: the recorded-pages bitmap of the largest run is
// 128 MiB.
const maxPages = 1 << 30

// malformed builds the error for a task that can never succeed.
func malformed(t *asynq.Task, why error) error {
	return fmt.Errorf("mapreduce: malformed %s task payload %.200q: %v: %w", t.Type(), t.Payload(), why, asynq.SkipRetry)
}

func decodeRunPayload(t *asynq.Task) (*runPayload, error) {
	var p runPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return nil, malformed(t, err)
	}
	if _, ok := jobOf(p.Run); !ok {
		return nil, malformed(t, fmt.Errorf("run ID %q is not <job>:<key>", p.Run))
	}
	return &p, nil
}

func decodeMapPayload(t *asynq.Task) (*mapPayload, error) {
	var p mapPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return nil, malformed(t, err)
	}
	if _, ok := jobOf(p.Run); !ok {
		return nil, malformed(t, fmt.Errorf("run ID %q is not <job>:<key>", p.Run))
	}
	if p.Index < 0 || p.Index >= maxPages {
		return nil, malformed(t, fmt.Errorf("page index %d is out of range [0, %d)", p.Index, maxPages))
	}
	if len(p.More) >= maxPack {
		return nil, malformed(t, fmt.Errorf("%d pages in one task: at most %d", len(p.More)+1, maxPack))
	}
	prev := p.Index
	for _, m := range p.More {
		if m.Index <= prev || m.Index >= maxPages || m.Index/maxPack != p.Index/maxPack {
			return nil, malformed(t, fmt.Errorf("page index %d follows %d: a task's pages are ascending, within one block of %d", m.Index, prev, maxPack))
		}
		prev = m.Index
	}
	return &p, nil
}

// runner finds the job of a run. A task of a job this worker does not run
// (two jobs sharing a queue, a rolling deploy that moves a job) is handed
// back: the error wraps errNotHosted, which IsFailure does not count and
// RetryDelay offers again after a few seconds, so the run neither fails nor
// loses retries. It is logged, since it means a queue is shared by workers
// that host different jobs. A task that no worker could ever run — no
// live worker announces its job and its run does not exist (a typo, a
// retired job) — is archived instead, with an error that says so.
func (c *Client) runner(ctx context.Context, t *asynq.Task, runID string) (jobRunner, error) {
	job, _ := jobOf(runID)
	r, ok := c.jobs.lookup(job)
	if !ok {
		if c.orphaned(ctx, job, runID) {
			return nil, fmt.Errorf("mapreduce: %s task of run %s: no live worker runs job %q and the run does not exist (never started, or expired after its retention): "+
				"no worker could ever run the task, so it is archived; if job %q is meant to run, start a worker that runs it and run the task again from asynq's archive, "+
				"else delete it there: %w", t.Type(), runID, job, job, asynq.SkipRetry)
		}
		Logger(ctx).Warn("mapreduce: handed back a task of a job this worker does not run; a worker that runs it will take it",
			"runs", c.jobs.Names())
		return nil, fmt.Errorf("mapreduce: %s task of run %s: job %q: %w (it runs: %s)", t.Type(), runID, job, errNotHosted, strings.Join(c.jobs.Names(), ", "))
	}
	return r, nil
}

// orphaned reports whether a task of run, of a job this worker does not
// run, can never run anywhere: no live worker announces the job and the
// run does not exist. When Redis does not answer it reports false: the
// task is handed back, and asked about again when it returns.
func (c *Client) orphaned(ctx context.Context, job, runID string) bool {
	if exists, err := c.ledger.exists(ctx, runID); err != nil || exists {
		return false
	}
	workers, err := c.Workers(ctx)
	if err != nil {
		return false
	}
	for _, w := range workers {
		if slices.Contains(w.Jobs, job) {
			return false
		}
	}
	return true
}

// enqueueStep enqueues the split or reduce task of a run; an existing task
// with that ID means it is already enqueued.
func (c *Client) enqueueStep(ctx context.Context, runID, nonce, typ string, o JobOptions) error {
	step := "split"
	if typ == typeReduce {
		step = "reduce"
	}
	return c.enqueueStepAs(ctx, runID, nonce, typ, step, o)
}

// enqueueStepAs is enqueueStep with the task ID's last part: a split that
// hands its run on enqueues "split:<page>" (feeder.handOff).
func (c *Client) enqueueStepAs(ctx context.Context, runID, nonce, typ, step string, o JobOptions) error {
	payload, _ := json.Marshal(runPayload{Run: runID, Nonce: nonce})
	timeout := o.SplitTimeout
	if typ == typeReduce {
		timeout = o.ReduceTimeout
	}
	err := withRedis(ctx, c.outages, "enqueuing the "+step, func(ctx context.Context) error {
		_, err := c.aq.EnqueueContext(ctx, asynq.NewTask(typ, payload),
			asynq.TaskID(taskID(runID, nonce, step)), asynq.Queue(o.Queue), asynq.MaxRetry(o.StepRetries+spareRetry),
			asynq.Timeout(timeout), asynq.Retention(o.Retention))
		return err
	})
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("enqueue %s of run %s: %w", step, runID, err)
	}
	return nil
}

// enqueueMap enqueues the map task of pages (mapTask): a task of one page
// of its own (typeMap), or of a pack's group (typePages). An existing task
// with its ID means it is already enqueued.
func (c *Client) enqueueMap(ctx context.Context, runID, nonce string, t mapTask, o JobOptions) error {
	p := mapPayload{Run: runID, Nonce: nonce, pagePart: newPagePart(t.pages[0].i, t.pages[0].page, o.Codec)}
	for _, m := range t.pages[1:] {
		p.More = append(p.More, newPagePart(m.i, m.page, o.Codec))
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return err
	}
	typ, id, timeout := typeMap, mapTaskID(runID, nonce, t.first), o.MapTimeout
	if t.packed {
		// Each page has MapTimeout (handleMap); the task, all of them.
		typ, id, timeout = typePages, pagesTaskID(runID, nonce, t.first), time.Duration(len(t.pages))*o.MapTimeout
	}
	err = withRedis(ctx, c.outages, "enqueuing pages", func(ctx context.Context) error {
		if c.enqueueFault != nil {
			if err := c.enqueueFault(t.pages[0].i); err != nil {
				return err
			}
		}
		_, err := c.aq.EnqueueContext(ctx, asynq.NewTask(typ, payload),
			asynq.TaskID(id), asynq.Queue(o.Queue), asynq.MaxRetry(o.MapRetries+spareRetry),
			asynq.Timeout(timeout))
		return err
	})
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("enqueue %s of run %s: %w", pagesName(t.pages[0].i, t.pages[len(t.pages)-1].i), runID, err)
	}
	return nil
}

// afterWork is the context of the Redis calls that record what a handler
// did. It outlives the task's own context: asynq archives a task whose
// deadline passed without waiting for its handler, so a record made with
// the expired context would be lost with it.
func afterWork(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

// lastAttempt reports whether the task's handler, returning err, has used
// up its job's retries (retries: JobOptions.MapRetries or StepRetries), or
// err is one no retry can fix. The caller then records the outcome and
// returns final(err), so that asynq archives the task.
//
// Tasks are enqueued with one asynq retry more than the job's (spareRetry):
// asynq archives a task whose retry count is spent before it asks
// IsFailure, so without the spare a task handed back on its last attempt
// (errNotHosted) would be archived instead of offered again. The job's own
// count is enforced here; a worker that dies on a task's last attempt gives
// it the spare attempt.
func lastAttempt(ctx context.Context, err error, retries int) bool {
	if errors.Is(err, asynq.SkipRetry) {
		return true
	}
	var m *malformedError
	if errors.As(err, &m) {
		return true
	}
	retried, ok := asynq.GetRetryCount(ctx)
	return ok && retried >= retries
}

// spareRetry is the asynq retry that tasks get beyond their job's retries.
const spareRetry = 1

// final marks err so that asynq archives its task instead of retrying it.
func final(err error) error {
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		return err
	}
	return finalError{err}
}

// finalError is err marked by final: it reads as err, which is what a
// page's recorded failure, the run's error and the log show, and wraps
// asynq.SkipRetry too, so that asynq archives its task.
type finalError struct{ err error }

func (e finalError) Error() string   { return e.err.Error() }
func (e finalError) Unwrap() []error { return []error{e.err, asynq.SkipRetry} }
