package mapreduce_test

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// resultOfPage is what the ledger job's Map returns for page i: results
// whose encodings (the string in quotes) run from 2 to 201 bytes, so that
// some share bundles and some have a field of their own, with both sides
// of a bundle's limit of 64 bytes; every 50th page fails for good.
func resultOfPage(i int) (string, error) {
	switch {
	case i%50 == 3:
		return "", fmt.Errorf("page %d fails", i)
	case i%7 == 0:
		return strings.Repeat("L", 100+i%100), nil
	case i%13 == 0:
		return strings.Repeat("e", 62), nil // 64 bytes encoded: bundled
	case i%17 == 0:
		return strings.Repeat("o", 63), nil // 65 bytes encoded: a field of its own
	case i%11 == 0:
		return "", nil
	}
	return strings.Repeat("s", i%60), nil
}

// ledgerJob emits pages 0 to n-1 and reduces them to one line per page,
// in the order Reduce sees them.
func ledgerJob(o mapreduce.JobOptions) mapreduce.Job[int, int, string, []string] {
	o.MapRetries = -1 // a failing page fails for good at once
	o.Semantics = mapreduce.CompleteSemantics
	return mapreduce.Job[int, int, string, []string]{
		Name:    "ledger",
		Options: o,
		Split:   emitPages,
		Map:     func(_ context.Context, i int) (string, error) { return resultOfPage(i) },
		Reduce: func(_ context.Context, _ int, pages iter.Seq2[mapreduce.PageResult[int, string], error]) ([]string, error) {
			var out []string
			for p, err := range pages {
				if err != nil {
					return nil, err
				}
				line := fmt.Sprintf("%d %q", p.Index, p.Result)
				if p.Err != nil {
					line = fmt.Sprintf("%d failed: %s", p.Index, p.Err)
				}
				out = append(out, line)
			}
			return out, nil
		},
	}
}

func wantLedger(t *testing.T, got []string, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("Reduce saw %d pages, want %d", len(got), n)
	}
	for i, line := range got {
		r, err := resultOfPage(i)
		want := fmt.Sprintf("%d %q", i, r)
		if err != nil {
			want = fmt.Sprintf("%d failed: ", i)
			if !strings.HasPrefix(line, want) || !strings.Contains(line, err.Error()) {
				t.Fatalf("Reduce saw %q for page %d; want its failure %q", line, i, err)
			}
			continue
		}
		if line != want {
			t.Fatalf("Reduce saw %q; want %q", line, want)
		}
	}
}

// A page's result of at most 64 bytes shares a field of the results hash
// with the other small results of its bundle of 128 pages, at two bytes
// beside its own, where a field of its own costs ~60: a 10M-page run's
// results hash was 644 MiB. Reduce reads every page back, in order,
// whichever way it was kept.
func TestSmallResultsShareBundlesAndReduceReadsEveryPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := ledgerJob(e.opts(mapreduce.JobOptions{}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 8)
	const pages = 1100 // three reads of 512 pages, nine bundles, the last ones partly filled
	id, err := job.Start(context.Background(), c, pages, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateSucceeded {
		t.Fatalf("state %s (%s), want succeeded", st.State, st.Error)
	}
	got, err := job.Result(st)
	if err != nil {
		t.Fatal(err)
	}
	wantLedger(t, got, pages)
	own := 0
	for i := range pages {
		if r, err := resultOfPage(i); err == nil && len(r)+2 > 64 {
			own++
		}
	}
	fields := e.rdb.HKeys(context.Background(), e.runKey(id, "results")).Val()
	if len(fields) != own+9 {
		t.Fatalf("the results hash has %d fields; want %d: one per result over 64 bytes, and 9 bundles for the rest", len(fields), own+9)
	}
	if n, err := c.StoredResults(context.Background(), id); err != nil || n != pages-pages/50 {
		t.Fatalf("%d results stored (%v); want %d, one per page that succeeded", n, err, pages-pages/50)
	}
}

// A run whose record lost its bundle size (something other than batchmr
// changed it) fails its reduce with an error that says so, rather than
// reading its results by another layout.
func TestARunWithoutItsBundleSizeFailsTheReduceSayingWhy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := ledgerJob(e.opts(mapreduce.JobOptions{StepRetries: -1}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	id, err := job.Start(ctx, c, 20, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HDel(ctx, e.runKey(id, "run"), "packed").Err(); err != nil {
		t.Fatal(err)
	}
	e.worker(c, 4)
	st := wait(t, c, id, 30*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, "small results are bundled") || !strings.Contains(st.Error, "changed by something other than batchmr") {
		t.Fatalf("state %s (%q); want failed, saying the record's bundle size was changed", st.State, st.Error)
	}
}

// A bundle that something other than batchmr wrote fails the reduce with
// an error that names its field, rather than handing Reduce wrong pages.
func TestAMalformedBundleFailsTheReduceNamingIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addJob(mapreduce.AddJob(e.jobs, sumJob("sum", newCounts(), e.opts(mapreduce.JobOptions{StepRetries: -1}))))
	c := e.client()
	ctx := context.Background()
	id := mustStart(t, c, "sum", sumArgs{N: 2000, PageSize: 5}, mapreduce.StartOptions{}) // 400 pages
	if err := c.ProcessTask(ctx, task(e.taskOf(mapreduce.TypeSplit, id))); err != nil {
		t.Fatal(err)
	}
	for _, ti := range e.pendingTasks(mapreduce.TypeMap) {
		if err := c.ProcessTask(ctx, task(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := c.Status(ctx, id); st.State != mapreduce.StateReducing {
		t.Fatalf("state %s, want reducing", st.State)
	}
	key := e.runKey(id, "results")
	b1 := e.rdb.HGet(ctx, key, "b1").Val()
	if err := e.rdb.HSet(ctx, key, "b1", b1[:len(b1)-1]).Err(); err != nil { // cut short
		t.Fatal(err)
	}
	e.worker(c, 2) // runs the reduce
	st := wait(t, c, id, 20*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, "pages 128-255 are malformed") || !strings.Contains(st.Error, "field b1") {
		t.Fatalf("run %s (%s); want it failed naming pages 128-255 and field b1", st.State, st.Error)
	}
}

// A run keeps the bundle size it started with: the reduce reads the run's,
// not its own release's. A size no release writes fails the run, naming
// it.
func TestAReduceReadsBundlesOfTheSizeTheRunStartedWith(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := ledgerJob(e.opts(mapreduce.JobOptions{AllowOverlap: true}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	ctx := context.Background()
	start := func(packed string) string {
		t.Helper()
		id, err := job.Start(ctx, c, 700, mapreduce.StartOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.HSet(ctx, e.runKey(id, "run"), "packed", packed).Err(); err != nil {
			t.Fatal(err)
		}
		return id
	}
	by64, bad := start("64"), start("300")
	e.worker(c, 8)
	st := wait(t, c, by64, 30*time.Second)
	got, err := job.Result(st)
	if err != nil || st.State != mapreduce.StateSucceeded {
		t.Fatalf("bundled by 64: state %s (%s), %v; want succeeded", st.State, st.Error, err)
	}
	wantLedger(t, got, 700)
	if n := e.rdb.HExists(ctx, e.runKey(by64, "results"), "b10").Val(); !n {
		t.Fatal("no field b10 in a 700-page run bundled by 64: its pages were not bundled by 64")
	}
	st = wait(t, c, bad, 30*time.Second)
	if st.State != mapreduce.StateFailed || !strings.Contains(st.Error, `bundled "300" pages`) {
		t.Fatalf("bundled by 300: state %s (%s); want failed, naming it", st.State, st.Error)
	}
}

// rawStrings encodes strings as their bytes, so that an empty result is
// no bytes at all; anything else as JSON.
type rawStrings struct{}

func (rawStrings) Marshal(v any) ([]byte, error) {
	if s, ok := v.(string); ok {
		return []byte(s), nil
	}
	return json.Marshal(v)
}

func (rawStrings) Unmarshal(b []byte, v any) error {
	if p, ok := v.(*string); ok {
		*p = string(b)
		return nil
	}
	return json.Unmarshal(b, v)
}

// A result a codec encodes as no bytes is a result, not a missing page.
func TestAResultOfNoBytesIsKeptInItsBundle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := ledgerJob(e.opts(mapreduce.JobOptions{Codec: rawStrings{}}))
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	e.worker(c, 8)
	id, err := job.Start(context.Background(), c, 300, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := wait(t, c, id, 30*time.Second)
	got, err := job.Result(st)
	if err != nil || st.State != mapreduce.StateSucceeded {
		t.Fatalf("state %s (%s), %v; want succeeded", st.State, st.Error, err)
	}
	wantLedger(t, got, 300) // pages 11, 22, 33, ... returned ""
}
