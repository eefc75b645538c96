package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Repairs counts what one Reconcile pass fixed.
type Repairs struct {
	SplitsEnqueued  int // splitting runs whose split task was gone
	ReducesEnqueued int // reducing runs whose reduce task was gone
	RunsFailed      int // runs whose split or reduce task asynq archived
	PagesFailed     int // unrecorded pages whose map task was archived or gone
	OrphansCopied   int // tasks asynq shows as active that no live worker holds (orphans.go)
}

func (r Repairs) total() int {
	return r.SplitsEnqueued + r.ReducesEnqueued + r.RunsFailed + r.PagesFailed + r.OrphansCopied
}

// maxPageChecks bounds the task lookups of one pass over one stuck run.
const maxPageChecks = 1000

// Reconcile makes one pass over the unfinished runs of every registered job
// and repairs what a crash or a lost enqueue left behind:
//   - a splitting run without a split task (Start died between creating the
//     run and enqueuing the split): the split is enqueued;
//   - a reducing run without a reduce task (the handler that recorded the
//     last page died before enqueuing it): the reduce is enqueued;
//   - a split or reduce task that asynq archived without our handler seeing
//     its last attempt (the worker crashed every time): the run fails with
//     the task's last error;
//   - a mapping run that recorded nothing for Config.StuckAfter: an unrecorded
//     page whose task asynq archived is recorded as failed with the task's
//     last error, and one whose task is gone (deleted by hand, lost in a
//     Redis failover) as failed too: its page descriptor went with it;
//   - a task that asynq shows as active while no live worker holds it (its
//     worker was killed, lost Redis as it finished, or has a skewed
//     clock), seen so for 8s by this or an earlier pass: a copy is
//     enqueued, if its run still needs it.
//
// Every repair is idempotent, so any number of workers may reconcile at
// once. RunReconciler calls it periodically.
func (c *Client) Reconcile(ctx context.Context) (Repairs, error) { return c.repairs.reconcile(ctx) }

// RunReconciler calls Reconcile every interval until ctx is done, logging
// what it repaired and what failed. Run it in every worker (or at least
// one): it is what turns a crash at the wrong moment into a delay rather
// than a stuck run.
func (c *Client) RunReconciler(ctx context.Context, interval time.Duration) {
	c.repairs.run(ctx, interval)
}

// repairer finds and repairs, for a Client, what a crash or a lost enqueue
// left behind in the runs of the jobs this process runs: runs without the
// task they wait for (this file) and tasks without a worker (orphans.go).
// It reads runs (through the ledger) and asynq's queues, records pages
// in the ledger as a handler would, and ends runs and enqueues their
// steps only through the run's state machine (runMachine), so that a
// repair is a step the run could have taken.
type repairer struct {
	rdb        redis.UniversalClient
	insp       *asynq.Inspector
	aq         *asynq.Client // enqueues orphans' copies
	prefix     string        // Config.Prefix
	jobs       *Jobs         // the jobs whose runs it repairs
	log        *slog.Logger
	stuckAfter time.Duration // Config.StuckAfter
	ledger     *ledger       // the runs' record: summaries, page states, records
	runs       runMachine
	bg         background // where RunReconciler reports Redis outages
}

// runMachine is what the repairs ask of the run's state machine: end
// runs, as a handler does (logged, and told to the Observer), and enqueue
// their steps.
type runMachine interface {
	// finish ends a run (client.go).
	finish(ctx context.Context, runID, nonce string, to State, result []byte, msg string, from State) (bool, State, error)
	// enqueueStepAs enqueues a run's split or reduce task (tasks.go).
	enqueueStepAs(ctx context.Context, runID, nonce, typ, step string, o JobOptions) error
}

var _ runMachine = (*Client)(nil)

// options returns a job's options with its queue resolved.
func (r *repairer) options(jr jobRunner) JobOptions {
	return specUnder(r.prefix, jr.name(), jr.options()).o
}

// reconcile is Client.Reconcile.
func (r *repairer) reconcile(ctx context.Context) (Repairs, error) {
	var rep Repairs
	var errs []error
	for _, job := range r.jobs.Names() {
		if err := r.reconcileJob(ctx, job, &rep); err != nil {
			errs = append(errs, fmt.Errorf("job %q: %w", job, err))
		}
	}
	n, err := r.reconcileOrphans(ctx)
	rep.OrphansCopied += n
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("mapreduce: reconcile: %w", err)
	}
	return rep, nil
}

// run is Client.RunReconciler.
func (r *repairer) run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	orphans := time.NewTicker(orphanScanEvery)
	defer orphans.Stop()
	var lastWarn time.Time
	for {
		rep, err := r.reconcile(ctx)
		switch {
		case err == nil:
			r.bg.backgroundAnswered(true)
		case ctx.Err() == nil && !r.bg.backgroundFailed(err, "reconciling"):
			r.log.Warn("mapreduce: reconcile failed; retrying at the next interval", "error", err)
		}
		if rep.total() > 0 {
			r.log.Info("mapreduce: reconciler repaired runs", "splits_enqueued", rep.SplitsEnqueued,
				"reduces_enqueued", rep.ReducesEnqueued, "runs_failed", rep.RunsFailed,
				"pages_failed", rep.PagesFailed, "orphans_copied", rep.OrphansCopied)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				break wait
			case <-orphans.C:
				// Quietly: an outage fails every scan, and the full pass
				// above reports failures once per interval.
				if _, err := r.reconcileOrphans(ctx); err != nil && ctx.Err() == nil && !r.bg.backgroundFailed(err, "looking for orphaned tasks") && time.Since(lastWarn) > interval {
					lastWarn = time.Now()
					r.log.Warn("mapreduce: looking for orphaned tasks failed; retrying", "error", err)
				}
			}
		}
	}
}

// reconcileOrphans looks for orphans of every job the repairer repairs.
// Only the jobs whose scan lock this call takes are scanned, and asynq's
// server list is read only if there is one: a fleet of many workers scans
// each job about once per orphanScanEvery, not once per worker.
func (r *repairer) reconcileOrphans(ctx context.Context) (int, error) {
	var jobs []string
	for _, job := range r.jobs.Names() {
		_, lockKey := r.orphanKeys(job)
		got, err := r.rdb.SetNX(ctx, lockKey, 1, orphanScanEvery*3/4).Result()
		if err != nil {
			return 0, fmt.Errorf("mapreduce: looking for orphaned tasks: %w", err)
		}
		if got {
			jobs = append(jobs, job)
		}
	}
	if len(jobs) == 0 {
		return 0, nil
	}
	held, err := r.heldTasks()
	if err != nil {
		return 0, fmt.Errorf("mapreduce: looking for orphaned tasks: %w", err)
	}
	copies := 0
	var errs []error
	for _, job := range jobs {
		n, err := r.repairOrphans(ctx, job, held)
		copies += n
		if err != nil {
			errs = append(errs, fmt.Errorf("job %q: %w", job, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return copies, fmt.Errorf("mapreduce: looking for orphaned tasks: %w", err)
	}
	return copies, nil
}

// reconcileJob repairs the unfinished runs of one job.
func (r *repairer) reconcileJob(ctx context.Context, job string, rep *Repairs) error {
	jr, _ := r.jobs.lookup(job)
	o := r.options(jr)
	runs, err := r.unfinishedRuns(ctx, job)
	if err != nil {
		return err
	}
	var errs []error
	for _, st := range runs {
		var err error
		switch st.State {
		case StateSplitting:
			err = r.repairStep(ctx, st, typeSplit, o, &rep.SplitsEnqueued, rep)
			// A split lasts most of a windowed run: pages it enqueued that
			// were lost would hold the window for good.
			if err == nil && st.resume > 0 && time.Since(st.Updated) >= r.stuckAfter {
				err = r.repairPages(ctx, st, st.resume, o, rep)
			}
		case StateReducing:
			err = r.repairStep(ctx, st, typeReduce, o, &rep.ReducesEnqueued, rep)
		case StateMapping:
			if time.Since(st.Updated) >= r.stuckAfter {
				err = r.repairPages(ctx, st, st.Total, o, rep)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", st.ID, err))
		}
	}
	return errors.Join(errs...)
}

// repairStep checks the split or reduce task of a run in that step.
func (r *repairer) repairStep(ctx context.Context, st *Status, typ string, o JobOptions, enqueued *int, rep *Repairs) error {
	runID := st.ID
	k, _ := keysUnder(r.prefix, runID)
	step := st.splitTask // the first split, or the one it handed on to
	if typ == typeReduce {
		step = "reduce"
	}
	info, err := r.insp.GetTaskInfo(o.Queue, taskID(runID, st.nonce, step))
	switch {
	case isTaskGone(err):
		if err := r.runs.enqueueStepAs(ctx, runID, st.nonce, typ, step, o); err != nil {
			return err
		}
		*enqueued++
	case err != nil:
		return err
	case typ == typeSplit && info.State == asynq.TaskStateCompleted:
		// It ended without ending the split (a hand-on whose enqueue was
		// lost, say): the run is still splitting, so hand it on again.
		switch err := r.handOn(ctx, k, runID, st.nonce, o); {
		case errors.Is(err, errRunGone): // it ended the split since the run was read
		case err != nil:
			return err
		default:
			*enqueued++
		}
	case info.State == asynq.TaskStateArchived:
		msg := fmt.Sprintf("mapreduce: the %s task was archived by asynq after its retries ran out: %s", step, info.LastErr)
		ended, _, err := r.runs.finish(ctx, runID, st.nonce, StateFailed, nil, msg, "")
		if err != nil {
			return err
		}
		if ended {
			rep.RunsFailed++
		}
	}
	return nil
}

// handOn hands a splitting run's split on to a new split task, as a
// split does (Client.handOn), from the run's resume mark.
func (r *repairer) handOn(ctx context.Context, k runKeys, runID, nonce string, o JobOptions) error {
	step, err := r.ledger.handOn(ctx, k, nonce, 0)
	if err != nil {
		return err
	}
	return r.runs.enqueueStepAs(ctx, runID, nonce, typeSplit, step, o)
}

// repairPages looks at the unrecorded pages below upto of a stuck run: a
// mapping run's total, or the resume mark of a splitting one (every page
// below it was enqueued). It records as failed the pages whose task is
// lost, and enqueues the reduce if one of them was the run's last page.
func (r *repairer) repairPages(ctx context.Context, st *Status, upto int, o JobOptions, rep *Repairs) error {
	k, _ := keysUnder(r.prefix, st.ID)
	bits, err := r.rdb.Get(ctx, k.recorded).Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	checks := 0
	reducing := false
	handled := map[int]bool{} // pages of a task looked at already
	for i := 0; i < upto && checks < maxPageChecks; i++ {
		if bitSet(bits, i) || handled[i] {
			continue
		}
		checks++
		pages, info, err := r.pageTask(st, i, upto, bits, o.Queue)
		if err != nil && !isTaskGone(err) {
			return err
		}
		for _, j := range pages {
			handled[j] = true
		}
		failures := lostPages(pages, info, err)
		if failures == nil {
			continue // pending, active, retrying: it will record itself
		}
		state, err := r.ledger.record(ctx, k, st.nonce, failures, 0, 0, "")
		if err != nil {
			return err
		}
		rep.PagesFailed += len(pages)
		reducing = reducing || state == StateReducing
	}
	if reducing { // a page recorded here was the last one
		return r.runs.enqueueStepAs(ctx, st.ID, st.nonce, typeReduce, "reduce", o)
	}
	return nil
}

// pageTask looks up the map task of unrecorded page i of a run, in queue:
// its pack's group task if that carries i, else the task of i alone (the
// rest of a block fed after the group's task went on a task:
// packing.feedFrom). It returns the unrecorded pages from i to upto that
// the task carries, and the lookup's answer.
func (r *repairer) pageTask(st *Status, i, upto int, bits []byte, queue string) ([]int, *asynq.TaskInfo, error) {
	if !st.pack.packed(i) {
		info, err := r.insp.GetTaskInfo(queue, mapTaskID(st.ID, st.nonce, i))
		return []int{i}, info, err
	}
	info, err := r.insp.GetTaskInfo(queue, pagesTaskID(st.ID, st.nonce, st.pack.group(i)))
	if err != nil && !isTaskGone(err) {
		return nil, nil, err
	}
	var carried []fedPage
	if err == nil {
		var p mapPayload
		if json.Unmarshal(info.Payload, &p) == nil {
			carried = p.parts()
		}
	}
	if !slices.ContainsFunc(carried, func(pg fedPage) bool { return pg.i == i }) {
		info, err = r.insp.GetTaskInfo(queue, mapTaskID(st.ID, st.nonce, i))
		return []int{i}, info, err
	}
	var pages []int
	for _, pg := range carried {
		if pg.i >= i && pg.i < upto && !bitSet(bits, pg.i) {
			pages = append(pages, pg.i)
		}
	}
	return pages, info, nil
}

// lostPages returns the failures to record for pages, whose map task's
// lookup answered info or err (a task gone): nil while the task may still
// record them itself.
func lostPages(pages []int, info *asynq.TaskInfo, err error) []pageOutcome {
	var why string
	descs := map[int][]byte{}
	switch {
	case isTaskGone(err):
		// Gone without being recorded: deleted by hand, or lost with a
		// Redis that failed over. Its page descriptors went with it.
		why = "mapreduce: the map task disappeared before its page was recorded"
	case info.State == asynq.TaskStateArchived:
		var p mapPayload
		_ = json.Unmarshal(info.Payload, &p)
		for _, pg := range p.parts() {
			descs[pg.i] = pg.page
		}
		why = "mapreduce: archived by asynq after its retries ran out: " + info.LastErr
	default:
		return nil
	}
	outcomes := make([]pageOutcome, len(pages))
	for n, j := range pages {
		b, _ := json.Marshal(failure{Page: descs[j], Error: why})
		outcomes[n] = pageOutcome{i: j, outcome: b, failed: true}
	}
	return outcomes
}

func isTaskGone(err error) bool {
	return errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound)
}

// unfinishedRuns returns the job's runs that have not ended, for the
// reconciler. It reads the job's index of them (start.lua lists a run,
// finish.lua takes it out, retry.lua lists it again), so that a pass costs
// the runs in progress, not every run kept for its retention. Entries
// whose record is gone (deleted by hand, or evicted) are taken out.
func (r *repairer) unfinishedRuns(ctx context.Context, job string) ([]*Status, error) {
	out, stale, err := r.ledger.unfinished(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("reading the unfinished runs of %q: %w", job, err)
	}
	if len(stale) > 0 {
		if _, err := r.unlist(ctx, jobKeysUnder(r.prefix, job), stale); err != nil {
			return nil, fmt.Errorf("unlisting ended runs of %q: %w", job, err)
		}
	}
	return out, nil
}

// unlist runs unlist.lua: it takes those of the runs runIDs of k's job
// that have ended or are gone out of the job's index of unfinished runs,
// and returns how many it took out.
func (r *repairer) unlist(ctx context.Context, k jobKeys, runIDs []string) (int, error) {
	args := []any{k.records}
	for _, runID := range runIDs {
		args = append(args, runID)
	}
	return scriptUnlist.Run(ctx, r.rdb, []string{k.unfinished}, args...).Int()
}
