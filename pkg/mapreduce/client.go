package mapreduce

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/internal/shorten"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Config configures a Client. The zero value is usable.
type Config struct {
	// Jobs holds the jobs this process runs: register the Client on an
	// asynq server (Register) to run them, and announce them (Announce) so
	// that any process can start them by name. Nil in a process that only
	// starts, inspects and cancels runs.
	Jobs *Jobs
	// Prefix starts every Redis key batchmr writes for runs. Default
	// "batchmr". asynq's own keys (tasks, queues) are asynq's: "asynq:…".
	Prefix string
	// Logger receives the Client's logs: each failed attempt of a task
	// (warn), each run's end (info; warn when it failed), outages and
	// repairs, and each task done (debug). The steps it runs get it, with
	// their attributes, from Logger(ctx). Default slog.Default().
	Logger *slog.Logger
	// EnqueueConcurrency is how many map tasks one split enqueues at once;
	// enqueues made at once share a Redis round trip. Default 16 (64
	// measured no faster).
	EnqueueConcurrency int
	// CancelPoll is how often a process checks whether the runs its
	// handlers work on were cancelled. Default 250ms.
	CancelPoll time.Duration
	// StuckAfter is how long a mapping run must go without recording a
	// page before Reconcile inspects its unrecorded pages one by one.
	// Default 2 minutes.
	StuckAfter time.Duration
	// Observer, if not nil, is told when a step starts work in this
	// process and how it ended, and of each run this process ends (see
	// Observer). Nil: none.
	Observer Observer
}

// Client starts, inspects and cancels runs of any job, and runs the jobs of
// its Config.Jobs when registered on a worker's asynq.ServeMux (Register).
// It is safe for concurrent use.
type Client struct {
	rdb     redis.UniversalClient
	jobs    *Jobs
	prefix  string
	log     *slog.Logger
	cfg     Config
	aq      *asynq.Client
	insp    *asynq.Inspector
	enqueue batchedScripts // what aq sends its enqueues through

	stallHandOff time.Duration        // tests shorten it
	enqueueFault func(page int) error // tests fail a page's enqueue with it

	watchMu  sync.Mutex
	watches  map[string]map[*watch]struct{}
	watching bool

	bigResultWarned atomic.Int64 // unix ns of the last warning of a large result
	handBackWarned  atomic.Int64 // unix ns of the last warning of a step its code handed back
	outages         *outage.Log  // steps' failed attempts that outages caused

	ledger  *ledger   // the runs' record in Redis (ledger.go)
	catalog *catalog  // the jobs and workers announced (catalog.go)
	repairs *repairer // what crashes and lost enqueues left behind (reconcile.go)
}

// New returns a Client that keeps runs in rdb and enqueues tasks through
// asynq on the same Redis. On a *redis.ClusterClient, New adds hooks that
// reload the client's map of slots when a node fails: go-redis would
// otherwise keep dialling a dead primary until the map ages out, a minute
// after a failover promoted its replica.
func New(rdb redis.UniversalClient, cfg Config) (*Client, error) {
	if rdb == nil {
		return nil, errors.New("mapreduce: New: nil redis client")
	}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		rediserr.ReloadSlotsOnErrors(c)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "batchmr"
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("mapreduce: New: Prefix %q contains a brace: braces are Redis Cluster hash tags, which batchmr sets itself", cfg.Prefix)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.EnqueueConcurrency < 0 || cfg.CancelPoll < 0 || cfg.StuckAfter < 0 {
		return nil, errors.New("mapreduce: New: EnqueueConcurrency, CancelPoll and StuckAfter must not be negative: leave them zero for the defaults")
	}
	if cfg.StuckAfter == 0 {
		cfg.StuckAfter = 2 * time.Minute
	}
	if cfg.EnqueueConcurrency == 0 {
		cfg.EnqueueConcurrency = 16
	}
	if cfg.CancelPoll == 0 {
		cfg.CancelPoll = 250 * time.Millisecond
	}
	c := &Client{
		rdb:     rdb,
		jobs:    cfg.Jobs,
		prefix:  cfg.Prefix,
		log:     cfg.Logger,
		cfg:     cfg,
		insp:    asynq.NewInspectorFromRedisClient(rdb),
		watches: map[string]map[*watch]struct{}{},

		stallHandOff: stallHandOff,
	}
	c.outages = outage.New(c.log, "mapreduce")
	c.ledger = newLedger(rdb, cfg.Prefix, c.outages)
	c.enqueue = batchedScripts{UniversalClient: rdb, batches: &sync.Map{}}
	c.aq = asynq.NewClientFromRedisClient(c.enqueue)
	c.catalog = &catalog{rdb: rdb, prefix: cfg.Prefix, jobs: cfg.Jobs, log: c.log, bg: c, runs: c.Runs}
	c.repairs = &repairer{
		rdb: rdb, insp: c.insp, aq: c.aq, prefix: cfg.Prefix, jobs: cfg.Jobs, log: c.log,
		stuckAfter: cfg.StuckAfter, ledger: c.ledger, runs: c, bg: c,
	}
	return c, nil
}

// StartOptions are the per-run options of Start.
type StartOptions struct {
	// Key names the run: the run ID is "<job>:<Key>", and every Start with
	// the same job and Key makes one run (the others get ErrRunExists).
	// Schedulers use the tick's time, so that replicas firing on the same
	// tick start the run once. Default: a new key from the current time and
	// random bits. Up to 200 characters from [A-Za-z0-9_.:+-].
	Key string
}

var keyRE = regexp.MustCompile(`^[A-Za-z0-9_.:+-]{1,200}$`)

// jobSpec is what starting a job's runs and enqueueing its tasks need: its
// name and its options, defaults applied and queue resolved. It comes from
// a registered job, a Job value, or the catalogue.
type jobSpec struct {
	name string
	o    JobOptions
}

// spec resolves a job's queue: by default its own, under the prefix.
func (c *Client) spec(name string, o JobOptions) jobSpec { return specUnder(c.prefix, name, o) }

// specUnder resolves a job's queue under prefix: by default the job's own,
// "<prefix>:<job>".
func specUnder(prefix, name string, o JobOptions) jobSpec {
	if o.Queue == "" {
		o.Queue = prefix + ":" + name
	}
	return jobSpec{name: name, o: o}
}

// options returns a registered job's options with its queue resolved.
func (c *Client) options(r jobRunner) JobOptions { return c.spec(r.name(), r.options()).o }

// start creates a run of a job with encoded, checked arguments.
func (c *Client) start(ctx context.Context, j jobSpec, encoded []byte, opts StartOptions) (string, error) {
	job, o := j.name, j.o
	key := opts.Key
	if key == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		key = time.Now().UTC().Format("20060102T150405.000Z") + "-" + hex.EncodeToString(b[:])
	} else if !keyRE.MatchString(key) {
		return "", fmt.Errorf("mapreduce: start %q: Key %q is invalid: use up to 200 characters from [A-Za-z0-9_.:+-]", job, key)
	}
	runID := job + ":" + key
	res, err := c.ledger.createRun(ctx, runID, j, encoded, newNonce())
	if err != nil {
		return "", fmt.Errorf("mapreduce: start %q: %w", job, err)
	}
	if res.unreplicated != nil {
		c.log.Warn("mapreduce: start: no replica acknowledged the new run in time; going on without one: a failover now may lose the run",
			attrRun, runID, attrJob, job, "error", res.unreplicated)
	}
	detail, nonce := res.detail, res.nonce
	switch res.status {
	case -1:
		return "", fmt.Errorf("mapreduce: start %q: %w: %s (set JobOptions.AllowOverlap to run both)", job, ErrRunActive, detail)
	case 0:
		if State(detail) == StateSplitting {
			// The first Start may have died before enqueuing the split.
			if err := c.enqueueStep(ctx, runID, nonce, typeSplit, o); err != nil {
				return runID, fmt.Errorf("mapreduce: start %s: %w", runID, err)
			}
		}
		return runID, fmt.Errorf("mapreduce: start %s: %w (state %s)", runID, ErrRunExists, detail)
	}
	if err := c.enqueueStep(ctx, runID, nonce, typeSplit, o); err != nil {
		return runID, fmt.Errorf("mapreduce: start %s: the run was created but its split could not be enqueued (a worker's reconciler will enqueue it): %w", runID, err)
	}
	return runID, nil
}

// newNonce draws a run's nonce: Start, and Retry for each attempt.
func newNonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Status returns a snapshot of the run, its arguments and result included,
// or an error wrapping ErrRunNotFound. To watch a run, poll StatusUpTo,
// which leaves out what may be large.
func (c *Client) Status(ctx context.Context, runID string) (*Status, error) {
	return c.ledger.status(ctx, runID)
}

// Wait blocks until the run has ended or ctx is done, and returns its last
// status: whole (as Status reads it) once the run has ended, its summary
// (as StatusUpTo(ctx, runID, 0) reads it, which is what Wait polls) if ctx
// ends first. A run that ended failed or cancelled is not an error: check
// Status.State. Redis being unreachable for a while is not an error either:
// Wait keeps trying until ctx is done.
func (c *Client) Wait(ctx context.Context, runID string) (*Status, error) {
	delay := 20 * time.Millisecond
	var last *Status
	var failed bool // an outage is under way: said once (outages), its end too
	var cause outage.Cause
	for {
		st, err := c.StatusUpTo(ctx, runID, 0)
		if err == nil && st.State.Ended() {
			st, err = c.Status(ctx, runID)
		}
		switch {
		case err == nil:
			if failed {
				c.outages.Ended(cause, "")
				failed = false
			}
			if st.State.Ended() {
				return st, nil
			}
			last = st
		case errors.Is(err, ErrRunNotFound), ctx.Err() != nil, !rediserr.Transient(err):
			return last, err
		default:
			failed, cause = true, redisOutage(err)
			job, _ := jobOf(runID)
			c.outages.Failed(nil, cause, "", err, slog.String("while", "waiting for a run"), slog.String(attrRun, runID), slog.String(attrJob, job))
		}
		select {
		case <-ctx.Done():
			state := State("unknown")
			if last != nil {
				state = last.State
			}
			return last, fmt.Errorf("mapreduce: wait %s: %w (last state %s)", runID, ctx.Err(), state)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// Cancel ends the run as cancelled: queued pages do not start, handlers at
// work on it see their context cancelled with cause ErrRunCancelled within
// Config.CancelPoll, and Reduce does not run. Cancelling a cancelled run does nothing; a run that
// succeeded or failed gives an error wrapping ErrRunEnded.
func (c *Client) Cancel(ctx context.Context, runID string) error {
	ended, state, err := c.finish(ctx, runID, "", StateCancelled, nil, "cancelled", "")
	if err != nil {
		return fmt.Errorf("mapreduce: cancel %s: %w", runID, err)
	}
	switch {
	case ended, state == StateCancelled:
		return nil
	case state == "":
		return fmt.Errorf("mapreduce: cancel %s: %w", runID, ErrRunNotFound)
	default:
		return fmt.Errorf("mapreduce: cancel %s: %w (%s)", runID, ErrRunEnded, state)
	}
}

// Runs returns the summaries of the job's runs still within their
// retention, newest first: each as Status reads it, without its arguments
// and result (Args, Result, ArgsBytes and ResultBytes are zero), so that a
// listing reads a few hundred bytes a run. ActiveRuns reads those not
// ended alone.
func (c *Client) Runs(ctx context.Context, job string) ([]*Status, error) {
	return c.ledger.runs(ctx, job)
}

// finish ends a run in the ledger (ledger.finish) and, if this call ended
// it, logs its outcome and tells the Observer.
func (c *Client) finish(ctx context.Context, runID, nonce string, to State, result []byte, msg string, from State) (ended bool, state State, err error) {
	ended, state, err = c.ledger.finish(ctx, runID, nonce, to, result, msg, from)
	if ended {
		c.logOutcome(ctx, runID, to, shorten.To(msg, errorMax))
		c.observeEnd(ctx, runID, to)
	}
	return ended, state, err
}
