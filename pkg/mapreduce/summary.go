package mapreduce

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// A run's record holds its arguments and result, which may take
// megabytes (JobOptions.MaxArgsBytes, maxResultBytes), beside a few
// hundred bytes of counters and times. Every read that lists or polls
// runs reads the summary alone; Status alone reads a run whole.

// summaryFields are the fields of a run's record that parseStatus reads,
// but its arguments and result.
var summaryFields = []string{
	"job", "state", "total", "done", "failed", "retries", "error", "nonce", "split_task", "resume",
	"pack", "pack_from", "map_n", "map_us", "expected", "fed", "fed_done",
	"created", "split_done", "updated", "finished", "retried", "retried_done",
	"last_error", "last_error_step", "last_error_at",
}

var (
	//go:embed scripts/read.lua
	luaRead    string
	scriptRead = redis.NewScript(luaRead)
)

// summaryOf makes a record of the values an HMGET of summaryFields
// returned; ok is false when the run has none of them (it does not exist).
func summaryOf(vals []any) (h map[string]string, ok bool) {
	h = make(map[string]string, len(summaryFields))
	for i, v := range vals {
		if s, isStr := v.(string); isStr && i < len(summaryFields) {
			h[summaryFields[i]] = s
		}
	}
	return h, len(h) > 0
}

// StatusUpTo returns a snapshot of the run as Status does, except that it
// leaves out (nil) the arguments, and the result, when larger than
// maxBytes; ArgsBytes and ResultBytes say how large they are either way.
// StatusUpTo(ctx, runID, 0) reads a few hundred bytes whatever the run
// holds: poll a run with it (Wait does), and read it whole once. It
// returns an error wrapping ErrRunNotFound for a run that does not exist.
func (c *Client) StatusUpTo(ctx context.Context, runID string, maxBytes int) (*Status, error) {
	return c.ledger.statusUpTo(ctx, runID, maxBytes)
}

// status is Client.Status.
func (l *ledger) status(ctx context.Context, runID string) (*Status, error) {
	k, err := l.keys(runID)
	if err != nil {
		return nil, fmt.Errorf("mapreduce: status: %w", err)
	}
	h, err := l.rdb.HGetAll(ctx, k.run).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: status %s: %w", runID, err)
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("mapreduce: status %s: %w (never started, or expired after its retention)", runID, ErrRunNotFound)
	}
	st := parseStatus(runID, h)
	st.ArgsBytes, st.ResultBytes = len(st.Args), len(st.Result)
	return st, nil
}

// statusUpTo is Client.StatusUpTo.
func (l *ledger) statusUpTo(ctx context.Context, runID string, maxBytes int) (*Status, error) {
	k, err := l.keys(runID)
	if err != nil {
		return nil, fmt.Errorf("mapreduce: status: %w", err)
	}
	argv := make([]any, 0, 1+len(summaryFields))
	argv = append(argv, max(maxBytes, 0))
	for _, f := range summaryFields {
		argv = append(argv, f)
	}
	res, err := scriptRead.Run(ctx, l.rdb, []string{k.run}, argv...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("mapreduce: status %s: %w (never started, or expired after its retention)", runID, ErrRunNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("mapreduce: status %s: %w", runID, err)
	}
	vals, _ := res.([]any)
	if len(vals) != 5 {
		return nil, fmt.Errorf("mapreduce: status %s: the read script replied %v", runID, res)
	}
	fields, _ := vals[0].([]any)
	h, _ := summaryOf(fields)
	if s, ok := vals[3].(string); ok {
		h["args"] = s
	}
	if s, ok := vals[4].(string); ok {
		h["result"] = s
	}
	st := parseStatus(runID, h)
	st.ArgsBytes = int(asInt64(vals[1]))
	st.ResultBytes = max(int(asInt64(vals[2])), 0)
	return st, nil
}

func asInt64(v any) int64 {
	n, _ := v.(int64)
	return n
}

// summaries reads the summaries of the runs runIDs in one round trip. It
// returns those that exist, in the order of runIDs, and the IDs of those that
// do not.
func (l *ledger) summaries(ctx context.Context, runIDs []string) (found []*Status, gone []string, err error) {
	cmds := make([]*redis.SliceCmd, len(runIDs))
	_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, runID := range runIDs {
			rk, _ := l.keys(runID)
			cmds[i] = p.HMGet(ctx, rk.run, summaryFields...)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	found = make([]*Status, 0, len(runIDs))
	for i, cmd := range cmds {
		if h, ok := summaryOf(cmd.Val()); ok {
			found = append(found, parseStatus(runIDs[i], h))
		} else {
			gone = append(gone, runIDs[i])
		}
	}
	return found, gone, nil
}

// ActiveRuns returns the summaries of the job's runs that have not ended,
// newest first, as Runs does, from the job's index of unfinished runs: it
// reads the runs in progress, not every run kept for its retention.
func (c *Client) ActiveRuns(ctx context.Context, job string) ([]*Status, error) {
	return c.ledger.activeRuns(ctx, job)
}

// runs is Client.Runs.
func (l *ledger) runs(ctx context.Context, job string) ([]*Status, error) {
	if !jobNameRE.MatchString(job) {
		return nil, fmt.Errorf("mapreduce: runs: job name %q is invalid", job)
	}
	k := jobKeysUnder(l.prefix, job)
	runIDs, err := l.rdb.ZRevRange(ctx, k.runs, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: runs of %q: %w", job, err)
	}
	out, _, err := l.summaries(ctx, runIDs)
	if err != nil {
		return nil, fmt.Errorf("mapreduce: runs of %q: %w", job, err)
	}
	return out, nil
}

// activeRuns is Client.ActiveRuns.
func (l *ledger) activeRuns(ctx context.Context, job string) ([]*Status, error) {
	if !jobNameRE.MatchString(job) {
		return nil, fmt.Errorf("mapreduce: active runs: job name %q is invalid", job)
	}
	out, _, err := l.unfinished(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("mapreduce: active runs of %q: %w", job, err)
	}
	slices.Reverse(out) // newest first
	return out, nil
}

// unfinished reads the job's index of runs not ended, oldest first: the
// runs in it not ended, and the IDs of those listed though ended or gone
// (the reconciler unlists them).
func (l *ledger) unfinished(ctx context.Context, job string) (active []*Status, stale []string, err error) {
	k := jobKeysUnder(l.prefix, job)
	runIDs, err := l.rdb.ZRange(ctx, k.unfinished, 0, -1).Result()
	if err != nil {
		return nil, nil, err
	}
	found, stale, err := l.summaries(ctx, runIDs)
	if err != nil {
		return nil, nil, err
	}
	active = found[:0]
	for _, st := range found {
		if st.State.Ended() {
			stale = append(stale, st.ID)
		} else {
			active = append(active, st)
		}
	}
	return active, stale, nil
}

// CountRuns returns how many of the job's runs within their retention are
// in each state, reading each run's state alone.
func (c *Client) CountRuns(ctx context.Context, job string) (map[State]int, error) {
	return c.ledger.countRuns(ctx, job)
}

// countRuns is Client.CountRuns.
func (l *ledger) countRuns(ctx context.Context, job string) (map[State]int, error) {
	if !jobNameRE.MatchString(job) {
		return nil, fmt.Errorf("mapreduce: count runs: job name %q is invalid", job)
	}
	k := jobKeysUnder(l.prefix, job)
	runIDs, err := l.rdb.ZRange(ctx, k.runs, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("mapreduce: count runs of %q: %w", job, err)
	}
	states, gone, err := l.states(ctx, runIDs)
	if err != nil {
		return nil, fmt.Errorf("mapreduce: count runs of %q: %w", job, err)
	}
	out := map[State]int{}
	for i, st := range states {
		switch {
		case gone[i]: // expired since the list was read: not counted
		case st == "":
			return nil, fmt.Errorf("mapreduce: count runs of %q: the state of %s could not be read", job, runIDs[i])
		default:
			out[st]++
		}
	}
	return out, nil
}
