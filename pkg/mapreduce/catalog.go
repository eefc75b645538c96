package mapreduce

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/redis/go-redis/v9"
)

// The catalogue is how any process learns which jobs exist without being
// built with them: every worker announces the jobs it runs (Announce),
// with a heartbeat, and the scheduler starts, lists and checks runs of any
// announced job. Its keys share the hash tag {catalog}:
//
//	<prefix>:{catalog}:jobs           HASH  job name -> JobInfo (JSON), last announcer wins
//	<prefix>:{catalog}:workers        ZSET  worker ID -> heartbeat deadline (ms, Redis time)
//	<prefix>:{catalog}:worker:<id>    STRING WorkerInfo (JSON), expires with the heartbeat
//	<prefix>:{catalog}:check:<job>    LIST  argument checks waiting for a host of the job
//	<prefix>:{catalog}:answer:<id>    LIST  one check's answer

// JobInfo describes a job as its workers announce it.
type JobInfo struct {
	Name string `json:"name"`
	// Queue is the asynq queue of the job's tasks.
	Queue string `json:"queue"`
	// ArgsType is the Go type of the job's arguments, and ArgsSchema its
	// shape as a JSON Schema (JSON codec only), for a person writing --args.
	ArgsType   string          `json:"args_type"`
	ArgsSchema json.RawMessage `json:"args_schema,omitempty"`
	// JSON is true when the job's codec is JSON: only then can a run be
	// started with StartJSON.
	JSON bool `json:"json"`
	// Validates is true when the job checks its arguments (Job.Validate).
	Validates bool `json:"validates,omitempty"`

	MapRetries    int           `json:"map_retries"`
	StepRetries   int           `json:"step_retries"`
	MapTimeout    time.Duration `json:"map_timeout"`
	SplitTimeout  time.Duration `json:"split_timeout"`
	ReduceTimeout time.Duration `json:"reduce_timeout"`
	Retention     time.Duration `json:"retention"`
	Semantics     string        `json:"semantics"`
	AllowOverlap  bool          `json:"allow_overlap,omitempty"`
	// PagesPerTask is JobOptions.PagesPerTask.
	PagesPerTask int `json:"pages_per_task,omitempty"`
	// MaxArgsBytes is JobOptions.MaxArgsBytes.
	MaxArgsBytes int `json:"max_args_bytes,omitempty"`

	// Announced is when a worker last announced the job.
	Announced time.Time `json:"announced"`
	// Workers are the live workers that run the job, filled in by
	// Client.Jobs. None means the job's runs would not start.
	Workers []WorkerInfo `json:"-"`
	// Disagree lists, by ID, the live workers that announce the job other
	// than this entry does (another argument type, queue or options: other
	// code under the same name, as in the middle of a deploy), filled in
	// by Client.Jobs. A run's tasks go to whichever worker takes them, so
	// while any are listed a run may fail or be read wrongly.
	Disagree []string `json:"-"`
}

// shape is a digest of what the job is (not when it was announced, nor
// who runs it), for telling two versions of a job apart.
func (i JobInfo) shape() string {
	i.Announced, i.Workers, i.Disagree = time.Time{}, nil, nil
	b, _ := json.Marshal(i)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// WorkerInfo describes a worker process, as it announces itself.
type WorkerInfo struct {
	// ID names the worker: host, process ID and random bits by default.
	ID      string         `json:"id"`
	Host    string         `json:"host"`
	PID     int            `json:"pid"`
	Started time.Time      `json:"started"`
	Jobs    []string       `json:"jobs"`
	Queues  map[string]int `json:"queues,omitempty"`
	// Semaphores are the fleet-wide semaphores the worker's jobs use.
	Semaphores []string `json:"semaphores,omitempty"`
	// Database says whether the worker has a database, as pkg/worker's
	// do (nil: the worker does not say, as a server of one's own need
	// not): 'scheduler jobs' names a worker of a job without one whose
	// other workers have one.
	Database *bool `json:"database,omitempty"`
	// Version is free text: the user's build, for telling deploys apart.
	Version string `json:"version,omitempty"`
	// Shapes holds, for each job the worker runs, a digest of its
	// announcement (argument type, queue, options): Client.Jobs compares
	// them to tell workers that run other code under a job's name.
	Shapes map[string]string `json:"shapes,omitempty"`
	// Seen is the worker's last heartbeat.
	Seen time.Time `json:"seen"`
}

// silentAfter is how long a worker may go without renewing its catalogue
// entry before Silent says so.
const silentAfter = 3 * heartbeatEvery

// Silent returns how long before now (Redis's time, as Seen is) the worker
// last renewed its catalogue entry (every 5 s), and whether that is 15 s
// or more: the worker is then most likely gone — killed, paused or cut off
// from Redis — although the catalogue lists it until its entry expires,
// 30 s after its last heartbeat.
func (w WorkerInfo) Silent(now time.Time) (time.Duration, bool) {
	d := max(now.Sub(w.Seen), 0)
	return d, !w.Seen.IsZero() && d >= silentAfter
}

func (j Job[A, P, R, O]) info() JobInfo {
	o := j.Options.withDefaults()
	info := JobInfo{
		Name:          j.Name,
		Queue:         o.Queue,
		ArgsType:      reflect.TypeFor[A]().String(),
		JSON:          o.Codec == JSON,
		Validates:     j.Validate != nil,
		MapRetries:    o.MapRetries,
		StepRetries:   o.StepRetries,
		MapTimeout:    o.MapTimeout,
		SplitTimeout:  o.SplitTimeout,
		ReduceTimeout: o.ReduceTimeout,
		Retention:     o.Retention,
		Semantics:     "success",
		AllowOverlap:  o.AllowOverlap,
		PagesPerTask:  o.PagesPerTask,
		MaxArgsBytes:  o.MaxArgsBytes,
	}
	if o.Semantics == CompleteSemantics {
		info.Semantics = "complete"
	}
	if info.JSON {
		info.ArgsSchema = argsSchemaOf(reflect.TypeFor[A]()).json
	}
	return info
}

// spec is the jobSpec of an announced job.
func (i JobInfo) spec() jobSpec {
	o := JobOptions{
		Queue: i.Queue, MapRetries: i.MapRetries, StepRetries: i.StepRetries,
		MapTimeout: i.MapTimeout, SplitTimeout: i.SplitTimeout, ReduceTimeout: i.ReduceTimeout,
		Retention: i.Retention, AllowOverlap: i.AllowOverlap,
		MaxArgsBytes: min(max(i.MaxArgsBytes, 0), maxArgsBytes),
	}
	// The announced values are the defaults applied; 0 retries was -1.
	if o.MapRetries == 0 {
		o.MapRetries = -1
	}
	if o.StepRetries == 0 {
		o.StepRetries = -1
	}
	return jobSpec{name: i.Name, o: o.withDefaults()}
}

// heartbeatTTL is how long a worker stays listed after its last heartbeat;
// heartbeatEvery how often it renews.
const (
	heartbeatEvery = 5 * time.Second
	heartbeatTTL   = 30 * time.Second
)

// NewWorkerInfo returns the WorkerInfo of this process for the jobs c
// runs: its host, process ID, a fresh ID and the jobs' queues.
func (c *Client) NewWorkerInfo() WorkerInfo {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	qs, _ := c.Queues(nil)
	return WorkerInfo{
		ID:      fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		Host:    host,
		PID:     os.Getpid(),
		Started: time.Now(),
		Jobs:    c.jobs.Names(),
		Queues:  qs,
	}
}

// Announce lists w and the jobs c runs in the catalogue, renews the
// listing every 5 seconds and answers argument checks of command-line
// starts (StartJSON) for those jobs, until ctx is done; it then withdraws
// the listing and returns. A worker that dies without withdrawing drops out
// of the listing 30 seconds after its last heartbeat. While Redis is
// unreachable it logs a warning and keeps trying. It returns an error at
// once only when c runs no job or w has no ID.
func (c *Client) Announce(ctx context.Context, w WorkerInfo) error { return c.catalog.announce(ctx, w) }

// Jobs returns every job announced in the catalogue, sorted by name, each
// with the live workers that run it. A job whose workers have all stopped
// stays listed with none: its runs would not start until one is back.
func (c *Client) Jobs(ctx context.Context) ([]JobInfo, error) { return c.catalog.list(ctx) }

// Job returns the catalogue's entry of one job, or an error wrapping
// ErrUnknownJob that lists the jobs there are.
func (c *Client) Job(ctx context.Context, name string) (JobInfo, error) {
	return c.catalog.job(ctx, name)
}

// ForgetJob removes a job nobody runs any more (retired or renamed) from
// the catalogue, so that it is no longer listed or started. It refuses,
// changing nothing, a job that a live worker runs (the worker would
// announce it again: stop it first) or that has a run not ended (cancel
// it first: no worker of the job is left to end it). A start that raced
// with it (one that read the catalogue before) puts the job back, and a
// worker of the job that starts later announces it again. Its ended runs
// stay in Redis until their retention ends, readable by ID.
func (c *Client) ForgetJob(ctx context.Context, name string) error {
	return c.catalog.forget(ctx, name)
}

// Workers returns the live workers, sorted by ID.
func (c *Client) Workers(ctx context.Context) ([]WorkerInfo, error) { return c.catalog.workers(ctx) }

// StartJSON starts a run of the job named job with arguments encoded as
// JSON (nil or empty: the zero value), for callers that do not have the
// job's Go type: a command line, an HTTP handler. A job this process runs
// is checked here; any other is looked up in the catalogue, and a live
// worker that runs it decodes the arguments and runs Validate before the
// run is created, answering within a few seconds. An error wrapping
// ErrInvalidArgs means nothing was created: arguments over the job's
// JobOptions.MaxArgsBytes (as its workers announce it) are refused before
// any worker is asked. If no worker answers (none is live), the run is
// created unchecked and its split checks the arguments, failing the run at
// once if they are invalid. Otherwise StartJSON returns what Job.Start
// does.
func (c *Client) StartJSON(ctx context.Context, job string, args json.RawMessage, opts StartOptions) (string, error) {
	spec, args, err := c.catalog.checkJSON(ctx, job, args)
	if err != nil {
		return "", fmt.Errorf("mapreduce: start %q: %w", job, err)
	}
	return c.start(ctx, spec, args, opts)
}

// CheckJSON checks arguments encoded as JSON for the job named job as
// StartJSON does, without starting a run: a scheduler checks the arguments
// of its schedules with it at start-up. It returns nil when no live worker
// could check them (they are then checked when a run starts).
func (c *Client) CheckJSON(ctx context.Context, job string, args json.RawMessage) error {
	if _, _, err := c.catalog.checkJSON(ctx, job, args); err != nil {
		return fmt.Errorf("mapreduce: check %q: %w", job, err)
	}
	return nil
}

// catalog reads and writes the catalogue (the keys above) for a Client:
// it announces the jobs this process runs, lists the jobs and workers
// announced, and checks a job's arguments here or on a worker that runs
// it (argcheck.go).
type catalog struct {
	rdb    redis.UniversalClient
	prefix string       // Config.Prefix: the catalogue's keys start with it
	jobs   *Jobs        // the jobs this process runs: announced, arguments checked here
	log    *slog.Logger // the Client's
	bg     background   // where the announcer reports Redis outages
	// runs returns a job's runs (Client.Runs): ForgetJob refuses a job
	// with a run not ended.
	runs func(ctx context.Context, job string) ([]*Status, error)
}

// key names a catalogue key: "<prefix>:{catalog}:" and parts joined by
// colons.
func (cat *catalog) key(parts ...string) string {
	return cat.prefix + ":{catalog}:" + strings.Join(parts, ":")
}

// announce is Client.Announce.
func (cat *catalog) announce(ctx context.Context, w WorkerInfo) error {
	names := cat.jobs.Names()
	if len(names) == 0 {
		return errors.New("mapreduce: announce: this Client runs no job: register jobs in Config.Jobs")
	}
	if w.ID == "" {
		return errors.New("mapreduce: announce: WorkerInfo.ID is empty: start from Client.NewWorkerInfo")
	}
	go cat.answerChecks(ctx)
	// What each job is does not change while the process runs: describe
	// it once (its schema takes reflection), stamp it at each heartbeat.
	infos := make([]JobInfo, 0, len(names))
	w.Shapes = make(map[string]string, len(names))
	for _, name := range names {
		r, _ := cat.jobs.lookup(name)
		info := r.info()
		info.Queue = specUnder(cat.prefix, name, r.options()).o.Queue
		infos = append(infos, info)
		w.Shapes[name] = info.shape()
	}
	var lastWarn time.Time
	for {
		err := cat.heartbeat(ctx, w, infos)
		if err == nil {
			cat.bg.backgroundAnswered(true)
		}
		if err != nil && ctx.Err() == nil && !cat.bg.backgroundFailed(err, "announcing this worker's jobs") && time.Since(lastWarn) > time.Minute {
			lastWarn = time.Now()
			cat.log.Warn("mapreduce: announcing this worker's jobs failed; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			cat.withdraw(ctx, w.ID)
			return nil
		case <-time.After(heartbeatEvery):
		}
	}
}

// heartbeat writes one heartbeat: the worker, and every job it runs.
func (cat *catalog) heartbeat(ctx context.Context, w WorkerInfo, infos []JobInfo) error {
	now, err := cat.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	w.Seen = now
	wb, _ := json.Marshal(w)
	jobs := make(map[string]any, len(infos))
	for _, info := range infos {
		info.Announced = now
		b, _ := json.Marshal(info)
		jobs[info.Name] = b
	}
	return rediserr.Tx(cat.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, cat.key("workers"), "-inf", strconv.FormatInt(now.UnixMilli(), 10))
		p.ZAdd(ctx, cat.key("workers"), redis.Z{Score: float64(now.Add(heartbeatTTL).UnixMilli()), Member: w.ID})
		p.Set(ctx, cat.key("worker", w.ID), wb, heartbeatTTL)
		p.HSet(ctx, cat.key("jobs"), jobs)
		return nil
	}))
}

// withdraw takes the worker out of the listing, trying for 2 seconds even
// though ctx is done; its jobs stay listed.
func (cat *catalog) withdraw(ctx context.Context, workerID string) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = cat.rdb.Pipelined(wctx, func(p redis.Pipeliner) error {
		p.ZRem(wctx, cat.key("workers"), workerID)
		p.Del(wctx, cat.key("worker", workerID))
		return nil
	})
}

// list is Client.Jobs.
func (cat *catalog) list(ctx context.Context) ([]JobInfo, error) {
	workers, err := cat.workers(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := cat.rdb.HGetAll(ctx, cat.key("jobs")).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: jobs: %w", err)
	}
	out := make([]JobInfo, 0, len(raw))
	for name, b := range raw {
		var info JobInfo
		if err := json.Unmarshal([]byte(b), &info); err != nil {
			return nil, fmt.Errorf("mapreduce: jobs: the catalogue entry of %q is malformed (%v): delete it with HDEL %s %s; a worker re-announces it", name, err, cat.key("jobs"), name)
		}
		shape := info.shape()
		for _, w := range workers {
			if slices.Contains(w.Jobs, name) {
				info.Workers = append(info.Workers, w)
				if s, ok := w.Shapes[name]; ok && s != shape {
					info.Disagree = append(info.Disagree, w.ID)
				}
			}
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b JobInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// job is Client.Job.
func (cat *catalog) job(ctx context.Context, name string) (JobInfo, error) {
	all, err := cat.list(ctx)
	if err != nil {
		return JobInfo{}, err
	}
	names := make([]string, 0, len(all))
	for _, j := range all {
		if j.Name == name {
			return j, nil
		}
		names = append(names, j.Name)
	}
	known := "none: no worker has announced a job yet; start a worker that runs it"
	if len(names) > 0 {
		known = strings.Join(names, ", ")
	}
	return JobInfo{}, fmt.Errorf("mapreduce: job %q: %w: no worker has announced it (known jobs: %s)", name, ErrUnknownJob, known)
}

// forget is Client.ForgetJob.
func (cat *catalog) forget(ctx context.Context, name string) error {
	info, err := cat.job(ctx, name)
	if errors.Is(err, ErrUnknownJob) {
		return fmt.Errorf("mapreduce: forget %s: %w: the catalogue has no job by that name ('scheduler jobs' lists them)", name, ErrUnknownJob)
	}
	if err != nil {
		return err
	}
	if len(info.Workers) > 0 {
		workerIDs := make([]string, len(info.Workers))
		for i, w := range info.Workers {
			workerIDs[i] = w.ID
		}
		return fmt.Errorf("mapreduce: forget %s: live workers run it (%s): stop them, or they announce it again", name, strings.Join(workerIDs, ", "))
	}
	if err := cat.noOpenRuns(ctx, name); err != nil {
		return err
	}
	key := cat.key("jobs")
	entry, err := cat.rdb.HGet(ctx, key, name).Result()
	if err == nil {
		err = cat.rdb.HDel(ctx, key, name).Err()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("mapreduce: forgetting job %s: %w", name, err)
	}
	// A start that read the catalogue before the HDEL may have created a
	// run since: such a run keeps its job listed.
	if err := cat.noOpenRuns(ctx, name); err != nil && entry != "" {
		if perr := cat.rdb.HSetNX(ctx, key, name, entry).Err(); perr != nil {
			return fmt.Errorf("%w; putting the job back in the catalogue failed too: %w", err, perr)
		}
		return err
	}
	return nil
}

// noOpenRuns returns an error naming the job's runs that have not ended,
// if any.
func (cat *catalog) noOpenRuns(ctx context.Context, job string) error {
	runs, err := cat.runs(ctx, job)
	if err != nil {
		return err
	}
	var open []string
	for _, st := range runs {
		if !st.State.Ended() {
			open = append(open, st.ID)
		}
	}
	if len(open) > 0 {
		return fmt.Errorf("mapreduce: forget %s: %d of its runs have not ended (%s): cancel them first", job, len(open), strings.Join(open, ", "))
	}
	return nil
}

// workers is Client.Workers.
func (cat *catalog) workers(ctx context.Context) ([]WorkerInfo, error) {
	now, err := cat.rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: workers: %w", err)
	}
	workerIDs, err := cat.rdb.ZRangeByScore(ctx, cat.key("workers"), &redis.ZRangeBy{Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: workers: %w", err)
	}
	out := make([]WorkerInfo, 0, len(workerIDs))
	if len(workerIDs) == 0 {
		return out, nil
	}
	keys := make([]string, len(workerIDs))
	for i, workerID := range workerIDs {
		keys[i] = cat.key("worker", workerID)
	}
	vals, err := cat.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: workers: %w", err)
	}
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue // expired between the two reads
		}
		var w WorkerInfo
		if json.Unmarshal([]byte(s), &w) == nil {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
