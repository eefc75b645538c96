package mapreduce

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// The task types, for tests that drive tasks by hand.
const (
	TypeSplit  = typeSplit
	TypeMap    = typeMap
	TypePages  = typePages
	TypeReduce = typeReduce
)

// PackSample is how many measured pages a run's split waits for before it
// decides how many pages a task carries.
const PackSample = packSample

// ProbePages is how many pages a split feeds a task each before it waits
// for PackSample of them to be measured.
const ProbePages = probePages

// SetProbeWait sets how long a split waits at most for its first pages to
// be measured, until restore is called. For tests that do not run in
// parallel.
func SetProbeWait(d time.Duration) (restore func()) {
	old := probeWait
	probeWait = d
	return func() { probeWait = old }
}

// SetPacking makes a run that has not fed a page yet pack its pages by k
// from page from, as if its split had decided so (feed.lua).
func (c *Client) SetPacking(ctx context.Context, id string, k, from int) error {
	keys, err := c.ledger.keys(id)
	if err != nil {
		return err
	}
	return c.rdb.HSet(ctx, keys.run, "pack", k, "pack_from", from).Err()
}

// Packing returns how a run packs its pages: k pages a task from page
// from on; k is 0 if it does not.
func (c *Client) Packing(ctx context.Context, id string) (k, from int, err error) {
	keys, err := c.ledger.keys(id)
	if err != nil {
		return 0, 0, err
	}
	v, err := c.rdb.HMGet(ctx, keys.run, "pack", "pack_from").Result()
	if err != nil {
		return 0, 0, err
	}
	k, _ = strconv.Atoi(str(v[0]))
	from, _ = strconv.Atoi(str(v[1]))
	return k, from, nil
}

// ProcessTask runs one task as a worker's asynq server would.
func (c *Client) ProcessTask(ctx context.Context, t *asynq.Task) error { return c.processTask(ctx, t) }

// StartAny starts a run of a job by name with arguments of any type,
// encoded as JSON: the tests' shorthand for StartJSON.
func (c *Client) StartAny(ctx context.Context, job string, args any, opts StartOptions) (string, error) {
	b, err := json.Marshal(args)
	if err != nil {
		return "", err
	}
	return c.StartJSON(ctx, job, b, opts)
}

// The orphan scan's graces.
const (
	OrphanGrace    = orphanGrace
	UnclaimedGrace = unclaimedGrace
)

// ScanOrphans runs one orphan scan of job now, as RunReconciler does every
// few seconds, without the scan lock; it returns how many copies it
// enqueued.
func (c *Client) ScanOrphans(ctx context.Context, job string) (int, error) {
	held, err := c.repairs.heldTasks()
	if err != nil {
		return 0, err
	}
	return c.repairs.repairOrphans(ctx, job, held)
}

// ClaimKey names the mark a handler leaves when it starts on attempt
// retried of task id.
func (c *Client) ClaimKey(job, id string, retried int) string {
	return claimKey(c.prefix, job, id, retried)
}

// PendingKey is asynq's list of a queue's pending tasks, as the split reads
// it.
func PendingKey(queue string) string { return pendingKey(queue) }

// ActiveKey is asynq's list of a queue's running tasks, as the split reads
// it.
func ActiveKey(queue string) string { return activeKey(queue) }

// SetStallHandOff sets how long c's splits wait on a stalled window before
// they hand their run on.
func (c *Client) SetStallHandOff(d time.Duration) { c.stallHandOff = d }

// WindowSizes returns the split's batch and backlog for a window.
func WindowSizes(window int) (batch, backlog int) { return windowSizes(window) }

// IsFeedMove reports whether args, a command's, run feed.lua to move a
// split's window (not to read it).
func IsFeedMove(args []any) bool {
	return len(args) > 2 && args[0] == "evalsha" && args[1] == scriptFeed.Hash() &&
		len(args) >= 3+2+7 // numkeys, 2 keys, and a move's pages (ARGV[7])
}

// IsSplitDone reports whether args, a command's, run splitdone.lua: the
// split recording its total.
func IsSplitDone(args []any) bool {
	return len(args) > 2 && args[0] == "evalsha" && args[1] == scriptSplitDone.Hash()
}

// SetEnqueueFault makes the enqueue of a map task fail with what fault
// returns for its page (nil: enqueue it), as if the split's worker died
// between feeding the page to the window and enqueuing it.
func (c *Client) SetEnqueueFault(fault func(page int) error) { c.enqueueFault = fault }

// StoredResults counts the results a run's results hash holds: a field per
// page, and each entry of a bundle of small results.
func (c *Client) StoredResults(ctx context.Context, id string) (int, error) {
	k, err := c.ledger.keys(id)
	if err != nil {
		return 0, err
	}
	h, err := c.rdb.HGetAll(ctx, k.results).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for f, v := range h {
		b, isBundle := strings.CutPrefix(f, "b")
		if !isBundle {
			n++
			continue
		}
		lo, err := strconv.Atoi(b)
		if err != nil {
			return 0, err
		}
		got, err := unbundle(lo*bundlePages, (lo+1)*bundlePages, bundlePages, []any{v})
		if err != nil {
			return 0, err
		}
		for _, r := range got {
			if r != nil {
				n++
			}
		}
	}
	return n, nil
}

// Unlist runs unlist.lua for runs of job, as a reconcile pass does for
// the runs it read as ended or gone; it returns how many it took out of
// the index of unfinished runs.
func (c *Client) Unlist(ctx context.Context, job string, ids ...string) (int, error) {
	k := jobKeysUnder(c.prefix, job)
	return c.repairs.unlist(ctx, k, ids)
}

// SetReduceReadBytes sets the most bytes of results one read of c's
// reduces fetches.
func (c *Client) SetReduceReadBytes(n int64) { c.ledger.readBytes = n }

// SyncedScripts are the SHA1s of the scripts whose writes wait for a
// replica where there is one: a run's creation, a page's record, the
// split's total, a run's end.
func SyncedScripts() []string {
	return []string{scriptStart.Hash(), scriptRecord.Hash(), scriptSplitDone.Hash(), scriptFinish.Hash()}
}

// StartScript is the SHA1 of the script that creates a run.
func StartScript() string { return scriptStart.Hash() }
