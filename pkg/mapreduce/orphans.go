package mapreduce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// An orphan is a task that asynq shows as active while no live worker
// works on it: its worker was killed, or the worker finished it but could
// not tell asynq (a Redis cut at that moment: asynq v0.26 retries the
// update with an expired context, so it never lands), or its worker's
// clock is fast and its lease, scored on that clock, looks valid for
// hours. asynq's own recoverer finds such tasks only once their lease has
// been expired for 30s, checking once a minute, and never while a skewed
// lease lies in the future. batchmr finds them from asynq's list of what
// each live server works on, which expires on Redis's clock (10s after a
// server's last heartbeat), and enqueues a copy of each: recording is
// exactly-once, so the copy and a late original cannot both count.

// orphanGrace is how long a task must be seen active with no live worker
// holding it before a copy is enqueued, if a handler started on it: longer
// than asynq's heartbeat (5s), after which a task a live worker just took
// shows in its list.
const orphanGrace = 8 * time.Second

// unclaimedGrace is the same for a task no handler started on: a live
// worker's handler claims its task within moments of taking it, long
// before asynq's heartbeat lists it. Such a task is most often one whose
// dequeue Redis ran after its worker had given up on the reply: a
// request held up by a network partition and delivered when it healed.
// Shorter than a scan interval, so that the scan after the one that first
// saw the task enqueues its copy.
const unclaimedGrace = 1500 * time.Millisecond

// orphanScanEvery is how often RunReconciler looks for orphans.
const orphanScanEvery = 2 * time.Second

// copySep separates an orphan's task ID from its copy's suffix; it cannot
// appear in a run ID.
const copySep = "~"

// orphanKeys are a job's keys for the orphan scan: first sightings of
// orphan candidates (task ID → Redis time in ms) and the lock that lets
// one worker at a time scan the job's queue.
func (r *repairer) orphanKeys(job string) (seen, lock string) {
	base := r.prefix + ":{" + job + "}"
	return base + ":orphans", base + ":orphan-scan"
}

// claimKey names the mark a handler leaves when it starts on attempt
// retried of task taskID, in job's slot under prefix. It lives
// orphanGrace: by then a live worker's heartbeat lists the task.
func claimKey(prefix, job, taskID string, retried int) string {
	return prefix + ":{" + job + "}:claim:" + taskID + "#" + strconv.Itoa(retried)
}

// heldTasks returns the IDs of the tasks live asynq servers work on.
func (r *repairer) heldTasks() (map[string]bool, error) {
	servers, err := r.insp.Servers()
	if err != nil {
		return nil, fmt.Errorf("listing asynq servers: %w", err)
	}
	held := map[string]bool{}
	for _, s := range servers {
		for _, w := range s.ActiveWorkers {
			held[w.TaskID] = true
		}
	}
	return held, nil
}

// repairOrphans looks for orphans of job's tasks (its caller holds the
// job's scan lock) and enqueues a copy of each that its run still needs.
// It returns how many copies it enqueued.
func (r *repairer) repairOrphans(ctx context.Context, job string, held map[string]bool) (int, error) {
	jr, ok := r.jobs.lookup(job)
	if !ok {
		return 0, nil
	}
	o := r.options(jr)
	seenKey, _ := r.orphanKeys(job)
	cands, err := r.orphanCandidates(o.Queue, held)
	if err != nil {
		return 0, err
	}
	if len(cands) == 0 {
		return 0, r.rdb.Del(ctx, seenKey).Err()
	}
	now, err := r.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	seen, err := r.sight(ctx, job, cands, now)
	if err != nil {
		return 0, err
	}
	copies := 0
	for i, t := range cands {
		if !r.due(ctx, seenKey, t, seen[i], now) {
			continue
		}
		enqueued, err := r.copyOrphan(ctx, t, o, seen[i].first)
		if err != nil {
			return copies, err
		}
		if enqueued {
			copies++
		}
		// The orphan stays active until asynq's recoverer takes it back (a
		// minute or more), and the scans see it all that time: it is
		// settled, so that they do not copy it again while its copy works.
		// Its entry goes once it is no longer a candidate. Should the copy
		// be orphaned in turn, the copy is the candidate then; should asynq
		// retry the orphan and its worker die too, that attempt is.
		r.rdb.HSet(ctx, seenKey, t.ID, settled(t))
	}
	return copies, nil
}

// orphanCandidates returns the tasks of batchmr's types that asynq shows
// as active in queue and that no live server holds.
func (r *repairer) orphanCandidates(queue string, held map[string]bool) ([]*asynq.TaskInfo, error) {
	var cands []*asynq.TaskInfo
	for page := 1; ; page++ {
		tasks, err := r.insp.ListActiveTasks(queue, asynq.Page(page), asynq.PageSize(1000))
		if isTaskGone(err) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("listing active tasks of queue %s: %w", queue, err)
		}
		for _, t := range tasks {
			if !held[t.ID] && (t.Type == typeSplit || t.Type == typeMap || t.Type == typePages || t.Type == typeReduce) {
				cands = append(cands, t)
			}
		}
		if len(tasks) < 1000 {
			break
		}
	}
	return cands, nil
}

// sighting is what the scans know of an orphan candidate: its first
// sighting (Redis time in ms, or settled's mark), and whether a handler
// claimed it.
type sighting struct {
	first   string
	claimed bool
}

// sight notes now as the first sighting of the candidates of job not seen
// before, forgets the sightings of tasks that are no longer candidates,
// and returns each candidate's sighting.
func (r *repairer) sight(ctx context.Context, job string, cands []*asynq.TaskInfo, now time.Time) ([]sighting, error) {
	seenKey, _ := r.orphanKeys(job)
	taskIDs := make([]string, len(cands))
	claimed := make([]*redis.IntCmd, len(cands))
	var firsts *redis.SliceCmd
	var known *redis.StringSliceCmd
	err := rediserr.Tx(r.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range cands {
			taskIDs[i] = t.ID
			p.HSetNX(ctx, seenKey, t.ID, now.UnixMilli())
			claimed[i] = p.Exists(ctx, claimKey(r.prefix, job, t.ID, t.Retried))
		}
		firsts = p.HMGet(ctx, seenKey, taskIDs...)
		known = p.HKeys(ctx, seenKey)
		p.PExpire(ctx, seenKey, 10*orphanGrace)
		return nil
	}))
	if err != nil {
		return nil, err
	}
	isCand := map[string]bool{}
	for _, id := range taskIDs {
		isCand[id] = true
	}
	var stale []string
	for _, id := range known.Val() {
		if !isCand[id] {
			stale = append(stale, id)
		}
	}
	if len(stale) > 0 {
		r.rdb.HDel(ctx, seenKey, stale...)
	}
	out := make([]sighting, len(cands))
	for i := range cands {
		first, _ := firsts.Val()[i].(string)
		out[i] = sighting{first: first, claimed: claimed[i].Val() == 1}
	}
	return out, nil
}

// due reports whether candidate t has been seen long enough to copy it:
// unclaimedGrace, or orphanGrace if a handler claimed it. An attempt
// settled already is not due; a later attempt of a task whose earlier one
// was settled is first seen now (seenKey notes it).
func (r *repairer) due(ctx context.Context, seenKey string, t *asynq.TaskInfo, s sighting, now time.Time) bool {
	if s.first == settled(t) {
		return false
	}
	if strings.HasPrefix(s.first, settledPrefix) {
		r.rdb.HSet(ctx, seenKey, t.ID, now.UnixMilli())
		return false
	}
	first, _ := strconv.ParseInt(s.first, 10, 64)
	grace := unclaimedGrace
	if s.claimed {
		grace = orphanGrace
	}
	return first != 0 && now.Sub(time.UnixMilli(first)) >= grace
}

// settled is what replaces the first sighting of orphan t once a scan has
// enqueued its copy, or found that its run needs none. It names t's
// attempt, which a later orphaned attempt of the same task does not match:
// by its retry count and, since asynq retries without counting what
// Client.IsFailure calls no failure (a transient error, a task handed
// back), by when it last failed.
func settled(t *asynq.TaskInfo) string {
	return settledPrefix + strconv.Itoa(t.Retried) + "#" + strconv.FormatInt(t.LastFailedAt.UnixMilli(), 10)
}

const settledPrefix = "settled#"

// copyOrphan enqueues a copy of orphan t if its run still needs it: an
// unrecorded page of a run still mapping, the split of a run still
// splitting, the reduce of a run still reducing. The copy's ID is derived
// from the orphan's and its first sighting, so that workers scanning at
// once enqueue it once.
func (r *repairer) copyOrphan(ctx context.Context, t *asynq.TaskInfo, o JobOptions, firstSeen string) (bool, error) {
	var p mapPayload // split and reduce payloads are its first fields
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return false, nil // not ours to repair: the handler archives it
	}
	runID := p.Run
	k, err := keysUnder(r.prefix, runID)
	if err != nil {
		return false, nil
	}
	pages := p.parts()
	st, nonce, recorded, err := r.ledger.pageState(ctx, k, pages[0].i, pages[len(pages)-1].i, "")
	if err != nil {
		return false, err
	}
	if nonce != p.Nonce {
		return false, nil
	}
	timeout, needed := copyNeeded(t.Type, st, len(recorded.unrecorded(pages)) > 0, len(pages), o)
	if !needed {
		return false, nil
	}
	base, _, _ := strings.Cut(t.ID, copySep)
	copyID := base + copySep + firstSeen
	opts := []asynq.Option{asynq.TaskID(copyID), asynq.Queue(t.Queue), asynq.MaxRetry(t.MaxRetry), asynq.Timeout(timeout)}
	if t.Type != typeMap && t.Type != typePages {
		// Kept once completed, as the step tasks are (enqueueStepAs): a
		// split's copy that fed becomes the run's split task (feed.lua),
		// which the reconciler must find completed, not gone.
		opts = append(opts, asynq.Retention(o.Retention))
	}
	_, err = r.aq.EnqueueContext(ctx, asynq.NewTask(t.Type, t.Payload), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("enqueuing a copy of orphaned task %s: %w", t.ID, err)
	}
	job, _ := jobOf(runID)
	attrs := []any{attrRun, runID, attrJob, job, attrTask, t.ID, "copy", copyID, "type", t.Type}
	switch t.Type {
	case typeMap:
		attrs = append(attrs, attrPage, p.Index)
	case typePages:
		attrs = append(attrs, attrPages, pageRange(pages[0].i, pages[len(pages)-1].i))
	}
	r.log.Warn("mapreduce: a task asynq shows as active has no live worker (killed, cut off from Redis, or with a skewed clock): enqueued a copy", attrs...)
	return true, nil
}

// copyNeeded reports whether the run of an orphaned task of type typ,
// carrying pages pages of which some are unrecorded (unrecorded), still
// needs a copy in state st, and the copy's timeout.
func copyNeeded(typ string, st State, unrecorded bool, pages int, o JobOptions) (time.Duration, bool) {
	switch typ {
	case typeMap, typePages:
		return time.Duration(pages) * o.MapTimeout, (st == StateSplitting || st == StateMapping) && unrecorded
	case typeSplit:
		return o.SplitTimeout, st == StateSplitting
	case typeReduce:
		return o.ReduceTimeout, st == StateReducing
	}
	return o.MapTimeout, true
}
