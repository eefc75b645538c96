package mapreduce

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// PageFailure is a page of a run that failed for good.
type PageFailure struct {
	// Index is the page's position in the split, from 0.
	Index int
	// Page is the page's descriptor as the job's Codec encoded it (JSON
	// unless the job has another Codec); empty if it could not be encoded.
	Page []byte
	// Error is the page's last error: its first 4 KiB.
	Error string
}

// Failures returns up to max of the run's pages that failed for good, by
// index, and how many there are in all; max < 1 means all of them. A run
// with no failed page gives none and 0, as does a run Retry resumed: it
// forgets the failed pages to run them again. An unknown run gives an error
// wrapping ErrRunNotFound.
func (c *Client) Failures(ctx context.Context, runID string, max int) ([]PageFailure, int, error) {
	return c.ledger.failures(ctx, runID, max)
}

// failures is Client.Failures.
func (l *ledger) failures(ctx context.Context, runID string, max int) ([]PageFailure, int, error) {
	k, err := l.keys(runID)
	if err != nil {
		return nil, 0, fmt.Errorf("mapreduce: failures: %w", err)
	}
	if n, err := l.rdb.Exists(ctx, k.run).Result(); err != nil {
		return nil, 0, fmt.Errorf("mapreduce: failures of %s: %w", runID, err)
	} else if n == 0 {
		return nil, 0, fmt.Errorf("mapreduce: failures of %s: %w (never started, or expired after its retention)", runID, ErrRunNotFound)
	}
	fields, err := l.rdb.HKeys(ctx, k.failures).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("mapreduce: failures of %s: %w", runID, err)
	}
	idx := make([]int, 0, len(fields))
	for _, f := range fields {
		if i, err := strconv.Atoi(f); err == nil {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	total := len(idx)
	if max > 0 && len(idx) > max {
		idx = idx[:max]
	}
	if len(idx) == 0 {
		return nil, total, nil
	}
	want := make([]string, len(idx))
	for j, i := range idx {
		want[j] = strconv.Itoa(i)
	}
	vals, err := l.rdb.HMGet(ctx, k.failures, want...).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("mapreduce: failures of %s: %w", runID, err)
	}
	out := make([]PageFailure, 0, len(idx))
	for j, i := range idx {
		s, ok := vals[j].(string)
		if !ok {
			continue // forgotten by a Retry between the two reads
		}
		var f failure
		if err := json.Unmarshal([]byte(s), &f); err != nil {
			f.Error = "malformed failure record: " + err.Error()
		}
		out = append(out, PageFailure{Index: i, Page: f.Page, Error: f.Error})
	}
	return out, total, nil
}
