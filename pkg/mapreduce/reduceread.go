package mapreduce

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The reduce's reads of a run's stored results and failures (ledger).

// storedPageChunk is about how many pages' bundles and sizes one round
// trip reads: rounded to a whole number of bundles.
const storedPageChunk = 512

// reduceReadBytes bounds the bytes of results and failure records one
// read of a reduce fetches (one larger result is read alone), so that a
// reduce over pages of megabytes each holds a few of them at a time, not a
// chunk's worth.
const reduceReadBytes = 8 << 20

// bundlePages is how many pages' small results share one field of a run's
// results hash (record.lua): a result of at most 64 bytes costs its length
// plus two bytes there, where a field of its own costs ~60 bytes more (a
// 10M-page run's results hash was 644 MiB). start.lua keeps it in the run
// ('packed'), and a reduce reads the run's, so that a run keeps the layout
// it started with. At most 256: an entry's index in its bundle is one
// byte.
const bundlePages = 128

// storedPages yields every page of a run in index order, reading them from
// Redis a chunk at a time, so that Reduce over a million pages never holds
// them all. Small results are read from bundles of per pages; for the
// others, and for failure records (if any page failed), it reads their
// sizes first (HSTRLEN), then the values in reads of at most
// l.readBytes.
func (l *ledger) storedPages(ctx context.Context, k runKeys, total, per, failed int) iter.Seq2[storedPage, error] {
	chunk := max(1, storedPageChunk/per) * per
	return func(yield func(storedPage, error) bool) {
		for lo := 0; lo < total; lo += chunk {
			hi := min(lo+chunk, total)
			pages, err := l.storedChunk(ctx, k, lo, hi, per, failed > 0)
			if err != nil {
				yield(storedPage{index: lo}, err)
				return
			}
			for group := pages; len(group) > 0; {
				n, err := l.readGroup(ctx, k, group)
				if err != nil {
					yield(storedPage{index: group[0].index}, err)
					return
				}
				for _, sp := range group[:n] {
					err := sp.err
					if err == nil && sp.result == nil && sp.failure == nil {
						err = fmt.Errorf("page %d has no recorded outcome (its keys expired, or were deleted)", sp.index)
					}
					if !yield(sp.storedPage, err) || err != nil {
						return
					}
				}
				group = group[n:]
			}
		}
	}
}

// pageToRead is a page of a chunk: its result if it was bundled, else the
// sizes of its result field and failure record, read by readGroup.
type pageToRead struct {
	storedPage
	resultSize, failureSize int64
	err                     error
}

// storedChunk reads the bundles of pages lo to hi-1 (lo a multiple of per)
// and then, for the pages none of them holds, the sizes of their result
// fields and, if failures, of their failure records: a run of small
// results costs one round trip a chunk.
func (l *ledger) storedChunk(ctx context.Context, k runKeys, lo, hi, per int, failures bool) ([]pageToRead, error) {
	var bundles []string
	for b := lo / per; b*per < hi; b++ {
		bundles = append(bundles, "b"+strconv.Itoa(b))
	}
	res, err := l.rdb.HMGet(ctx, k.results, bundles...).Result()
	if err != nil {
		return nil, fmt.Errorf("reading pages %d-%d: %w", lo, hi-1, err)
	}
	bundled, err := unbundle(lo, hi, per, res)
	if err != nil {
		return nil, err
	}
	pages := make([]pageToRead, hi-lo)
	var rest []int // positions of the pages no bundle holds
	for j := range pages {
		pages[j].index = lo + j
		if pages[j].result = bundled[j]; pages[j].result == nil {
			rest = append(rest, j)
		}
	}
	if len(rest) == 0 {
		return pages, nil
	}
	sizes := make([]*redis.IntCmd, len(rest))
	fsizes := make([]*redis.IntCmd, len(rest))
	_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for n, j := range rest {
			field := strconv.Itoa(lo + j)
			sizes[n] = p.HStrLen(ctx, k.results, field)
			if failures {
				fsizes[n] = p.HStrLen(ctx, k.failures, field)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the sizes of pages %d-%d: %w", lo, hi-1, err)
	}
	for n, j := range rest {
		pages[j].resultSize = sizes[n].Val()
		if failures {
			pages[j].failureSize = fsizes[n].Val()
		}
	}
	return pages, nil
}

// readGroup reads the results and failure records of the first pages of
// group whose sizes add up to at most l.readBytes (at least one
// page), and returns how many pages it read.
func (l *ledger) readGroup(ctx context.Context, k runKeys, group []pageToRead) (int, error) {
	var results, failures []string
	var at []*pageToRead
	var budget int64
	n := 0
	for ; n < len(group); n++ {
		sp := &group[n]
		size := sp.resultSize + sp.failureSize
		if n > 0 && budget+size > l.readBytes {
			break
		}
		budget += size
		switch {
		case sp.resultSize > 0:
			results = append(results, strconv.Itoa(sp.index))
		case sp.result == nil:
			// A failure, or an empty result of a run started before
			// bundles (HSTRLEN reads 0 for an empty field and for none).
			results = append(results, strconv.Itoa(sp.index))
			failures = append(failures, strconv.Itoa(sp.index))
		default:
			continue
		}
		at = append(at, sp)
	}
	if len(at) == 0 {
		return n, nil
	}
	var res, fail *redis.SliceCmd
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		res = p.HMGet(ctx, k.results, results...)
		if len(failures) > 0 {
			fail = p.HMGet(ctx, k.failures, failures...)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("reading pages %d-%d: %w", group[0].index, group[n-1].index, err)
	}
	var failed []any
	if fail != nil {
		failed = fail.Val()
	}
	setOutcomes(at, res.Val(), failed)
	return n, nil
}

// setOutcomes sets the outcomes of the pages at from what readGroup read
// of them: results, one for each page, and failure records, one for each
// page whose result's size it read as 0.
func setOutcomes(at []*pageToRead, results, failures []any) {
	f := 0
	for r, sp := range at {
		s, isResult := results[r].(string)
		if isResult {
			sp.result = []byte(s)
		}
		if sp.resultSize > 0 {
			continue
		}
		rec, isFailure := failures[f].(string)
		f++
		if isResult || !isFailure {
			continue
		}
		sp.failure = &failure{}
		if uerr := json.Unmarshal([]byte(rec), sp.failure); uerr != nil {
			sp.err = fmt.Errorf("page %d: malformed failure record: %w", sp.index, uerr)
		}
	}
}

// unbundle returns the results of pages lo to hi-1 (lo a multiple of per)
// held in the bundles of per pages read for them, in page order; a page
// with none in them is nil. Bundles are strings of entries <index within
// the bundle><length><bytes> (record.lua); a missing one is nil.
func unbundle(lo, hi, per int, bundles []any) ([][]byte, error) {
	out := make([][]byte, hi-lo)
	for n, v := range bundles {
		s, ok := v.(string)
		if !ok {
			continue
		}
		first := (lo/per + n) * per
		for at := 0; at < len(s); {
			if at+2 > len(s) || at+2+int(s[at+1]) > len(s) || int(s[at]) >= per {
				return nil, fmt.Errorf("the results of pages %d-%d are malformed at byte %d of %d: field b%d of the run's results hash was written by something other than batchmr",
					first, first+per-1, at, len(s), lo/per+n)
			}
			i, size := first+int(s[at]), int(s[at+1])
			if i >= lo && i < hi {
				out[i-lo] = []byte(s[at+2 : at+2+size])
			}
			at += 2 + size
		}
	}
	return out, nil
}

// describeFailures names the failed pages of a run, for the error of a run
// that fails under SuccessSemantics: the first ten, from the failures hash
// alone.
func (l *ledger) describeFailures(ctx context.Context, k runKeys, total, failed int) (string, error) {
	const show = 10
	fields, err := l.rdb.HKeys(ctx, k.failures).Result()
	if err != nil {
		return "", err
	}
	idx := make([]int, 0, len(fields))
	for _, f := range fields {
		if i, err := strconv.Atoi(f); err == nil {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	idx = idx[:min(show, len(idx))]
	first := make([]string, len(idx))
	for j, i := range idx {
		first[j] = strconv.Itoa(i)
	}
	var vals []any
	if len(first) > 0 {
		if vals, err = l.rdb.HMGet(ctx, k.failures, first...).Result(); err != nil {
			return "", err
		}
	}
	parts := make([]string, 0, len(idx))
	for j, i := range idx {
		var f failure
		if s, ok := vals[j].(string); ok {
			_ = json.Unmarshal([]byte(s), &f)
		}
		parts = append(parts, fmt.Sprintf("page %d: %s", i, f.Error))
	}
	more := ""
	if failed > len(parts) {
		more = fmt.Sprintf("; and %d more", failed-len(parts))
	}
	return fmt.Sprintf("%d of %d pages failed (SuccessSemantics: Reduce not run): %s%s", failed, total, strings.Join(parts, "; "), more), nil
}
