package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/internal/tests/testenv/testhost"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// The scheduler is built with no job: every test's job lives in the test
// process, which announces it as a worker would, and the scheduler learns
// it from the catalogue.

func TestRunStartsAnAnnouncedJobAndWaitPrintsItsResult(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)

	out, errs, code := s.run("run", "sum", "--args", `{"n": 100, "page_size": 10}`, "--wait")
	got := lines(out)
	if code != 0 || len(got) != 2 || !strings.HasPrefix(got[0], "sum:") || got[1] != "5050" {
		t.Fatalf("run --wait: exit %d, stdout %q, stderr %q; want exit 0, the run ID then its result 5050", code, out, errs)
	}
	if !strings.Contains(errs, got[0]+" succeeded") {
		t.Errorf("run --wait: stderr %q does not say the run succeeded", errs)
	}
	st, err := f.mr.Status(context.Background(), got[0])
	if err != nil || st.State != mapreduce.StateSucceeded || st.Done != 10 {
		t.Errorf("the run in Redis: %+v, %v; want succeeded with 10 pages", st, err)
	}
}

func TestRunRefusesInvalidArgsAtOnceWithTheJobsOwnMessage(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)

	// The live worker decodes the arguments strictly and runs Validate.
	for _, tc := range []struct{ args, want string }{
		{`{"n": 5, "page_size": -5}`, `invalid arguments for job "sum": page_size -5: use at least 1`},
		{`{"n": 5, "pagesize": 5}`, `json: unknown field "pagesize"`},
		{`{"n": "five", "page_size": 5}`, `cannot unmarshal string into Go struct field sumArgs.n of type int`},
	} {
		began := time.Now()
		out, errs, code := s.run("run", "sum", "--args", tc.args)
		if code != 1 || !strings.Contains(errs, tc.want) || !oneLine(errs) || out != "" {
			t.Errorf("run sum --args %s: exit %d, stdout %q, stderr %q; want exit 1 and one line saying %q", tc.args, code, out, errs, tc.want)
		}
		// A worker that did not answer would let the run be created after 5s.
		if took := time.Since(began); took > 4*time.Second {
			t.Errorf("run sum --args %s took %v: not refused at once", tc.args, took)
		}
	}
	if runs, err := f.mr.Runs(context.Background(), "sum"); err != nil || len(runs) != 0 {
		t.Errorf("refused arguments created runs: %v, %v", runs, err)
	}
}

func TestRunOfAnUnknownJobNamesTheKnownJobs(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil), sumJob("other", nil))
	s := newScheduler(t, f)

	_, errs, code := s.run("run", "nosuchjob")
	if code != 1 || !oneLine(errs) || !strings.Contains(errs, `no job "nosuchjob"`) || !strings.Contains(errs, "known jobs: other, sum") {
		t.Errorf("run nosuchjob: exit %d, stderr %q; want exit 1 and one line naming it and the known jobs", code, errs)
	}
}

func TestRunOfAJobNoLiveWorkerRunsWarnsAndStartsItAnyway(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	_, stop := f.host(nil, sumJob("lost", nil))
	stop()
	s := newScheduler(t, f)

	out, errs, code := s.run("run", "lost", "--args", `{"n": 5, "page_size": 1}`)
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "lost:") || !strings.Contains(errs, "warning: no live worker runs lost, so the run will wait until one starts") ||
		!strings.Contains(errs, "the job's own Validate has not checked --args: it runs when a worker takes the run") {
		t.Fatalf("run lost: exit %d, stdout %q, stderr %q; want exit 0, the run ID and a warning that no live worker runs the job, so its Validate runs later", code, out, errs)
	}
	if st := f.state(id); st != mapreduce.StateSplitting {
		t.Errorf("the run is %s, want splitting: waiting for a worker", st)
	}
	// With nobody to check them, the arguments are checked against the
	// fields the job's workers announced.
	for _, tc := range []struct{ args, want string }{
		{`{"n": 5, "pagesize": 5}`, `run lost: --args: unknown field "pagesize" (its fields: n, page_size)`},
		{`{"n": "five"}`, `run lost: --args: field "n" is a string ("five"), not an integer`},
	} {
		out, errs, code := s.run("run", "lost", "--args", tc.args)
		if code != 1 || out != "" || !oneLine(errs) || !strings.Contains(errs, tc.want) {
			t.Errorf("run lost --args %s: exit %d, stdout %q, stderr %q; want exit 1 and one line saying %q", tc.args, code, out, errs, tc.want)
		}
	}
	if runs, _ := f.mr.Runs(context.Background(), "lost"); len(runs) != 1 {
		t.Errorf("lost has %d runs, want only the first: refused arguments create none", len(runs))
	}
}

// boundedArgs state their bounds in jsonschema tags: the scheduler checks
// them with no worker live.
type boundedArgs struct {
	PageSize int    `json:"page_size" jsonschema:"required,minimum=1"`
	Mode     string `json:"mode,omitempty" jsonschema:"enum=full,enum=delta"`
}

func boundedJob() mapreduce.Job[boundedArgs, int, int, int] {
	return mapreduce.Job[boundedArgs, int, int, int]{
		Name:  "bounded",
		Split: func(ctx context.Context, a boundedArgs, emit func(int) error) error { return emit(1) },
		Map:   func(ctx context.Context, p int) (int, error) { return p, nil },
	}
}

func TestRunWithNoLiveWorkerRefusesArgsOutsideTheAnnouncedBoundsCreatingNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	_, stop := f.host(nil, boundedJob())
	stop()
	s := newScheduler(t, f)

	for _, tc := range []struct{ args, want string }{
		{`{"page_size": -1}`, `run bounded: --args: field "page_size" is -1, under its minimum 1`},
		{`{"mode": "full"}`, `run bounded: --args: field "page_size" is missing: it is required`},
		{``, `run bounded: --args: field "page_size" is missing: it is required`},
		{`{"page_size": 5, "mode": "half"}`, `run bounded: --args: field "mode" is a string ("half"), not one of "full", "delta"`},
	} {
		args := []string{"run", "bounded"}
		if tc.args != "" {
			args = append(args, "--args", tc.args)
		}
		out, errs, code := s.run(args...)
		if code != 1 || out != "" || !oneLine(errs) || !strings.Contains(errs, tc.want) {
			t.Errorf("run bounded --args %s: exit %d, stdout %q, stderr %q; want exit 1 and one line saying %q", tc.args, code, out, errs, tc.want)
		}
	}
	if runs, _ := f.mr.Runs(context.Background(), "bounded"); len(runs) != 0 {
		t.Errorf("bounded has %d runs, want none: refused arguments create none", len(runs))
	}
}

func TestJobsShowsTheBoundsOfEachArgument(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, boundedJob())
	s := newScheduler(t, f)

	out, errs, code := s.run("jobs")
	if want := "main_test.boundedArgs {mode string full|delta, page_size integer ≥1 required}"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("jobs: exit %d, stdout %q, stderr %q; want the arguments %q", code, out, errs, want)
	}
}

func TestRunWithAKeyStartsOneRunPerKey(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)

	args := []string{"run", "sum", "--key", "tick-1", "--args", `{"n": 3, "page_size": 1}`}
	if out, errs, code := s.run(args...); code != 0 || strings.TrimSpace(out) != "sum:tick-1" {
		t.Fatalf("run --key: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, errs, code := s.run(args...); code != 0 || strings.TrimSpace(out) != "sum:tick-1" || !strings.Contains(errs, "run sum:tick-1 already exists (--key tick-1 names it): no new run was started") {
		t.Errorf("second run --key: exit %d, stdout %q, stderr %q; want the same ID and 'already exists'", code, out, errs)
	}
	// The same arguments written otherwise are the same: no warning.
	if out, errs, code := s.run("run", "sum", "--key", "tick-1", "--args", `{ "page_size": 1, "n": 3 }`); code != 0 || strings.TrimSpace(out) != "sum:tick-1" || strings.Contains(errs, "warning") {
		t.Errorf("run --key with the same arguments reordered: exit %d, stdout %q, stderr %q; want the same run and no warning", code, out, errs)
	}
	// So are they with a field's name in another case, as encoding/json
	// matches it.
	if out, errs, code := s.run("run", "sum", "--key", "tick-1", "--args", `{"N": 3, "page_size": 1}`); code != 0 || strings.TrimSpace(out) != "sum:tick-1" {
		t.Errorf("run --key with the same arguments, a field's name in another case: exit %d, stdout %q, stderr %q; want the same run", code, out, errs)
	}
	// Other arguments under the same key are refused, showing both: a
	// script must not take the run of other arguments for its own.
	if out, errs, code := s.run("run", "sum", "--key", "tick-1", "--args", `{"n": 4, "page_size": 1}`); code != 1 || out != "" || !oneLine(errs) ||
		!strings.Contains(errs, "run sum:tick-1 already exists (--key tick-1 names it) with other arguments") || !strings.Contains(errs, `{"n": 4, "page_size": 1}`) ||
		!strings.Contains(errs, `{"n":3,"page_size":1}`) || !strings.Contains(errs, "use another --key") {
		t.Errorf("run --key with other arguments: exit %d, stdout %q, stderr %q; want exit 1, no run ID, and one line showing both and the fix", code, out, errs)
	}
	if out, errs, code := s.run("run", "sum", "--key", "tick-1", "--args", `{"n": 4, "page_size": 1}`, "--wait"); code != 1 || out != "" || !strings.Contains(errs, "with other arguments") {
		t.Errorf("run --key --wait with other arguments: exit %d, stdout %q, stderr %q; want exit 1 before following", code, out, errs)
	}
	if runs, _ := f.mr.Runs(context.Background(), "sum"); len(runs) != 1 {
		t.Errorf("two starts with one key made %d runs", len(runs))
	}
}

func TestStatusShowsARunAndCancelStopsIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	held, _ := gate(t)
	f.host(nil, sumJob("held", held), sumJob("sum", nil))
	s := newScheduler(t, f)
	ctx := context.Background()

	id, err := f.mr.StartJSON(ctx, "held", []byte(`{"n": 4, "page_size": 2}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the split", func() bool { return f.state(id) == mapreduce.StateMapping })
	out, errs, code := s.run("status", id, "--json")
	var st struct {
		ID, Job, State      string
		Total, Done, Failed int
		Created             time.Time
		Args                map[string]int
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.ID != id || st.Job != "held" ||
		st.State != "mapping" || st.Total != 2 || st.Done != 0 || st.Created.IsZero() || st.Args["n"] != 4 || st.Args["page_size"] != 2 {
		t.Fatalf("status --json: exit %d, %q, stderr %q (%v); want the run mapping 0/2 pages, with its args", code, out, errs, err)
	}
	if out, _, _ := s.run("status", id); !regexp.MustCompile(`(?m)^changed  \S+ \(\d+s ago\)$`).MatchString(out) {
		t.Errorf("status of an active run: %q, want when it last changed", out)
	}
	// Its pages hang: two minutes without a change.
	ms := strconv.FormatInt(time.Now().Add(-2*time.Minute).UnixMilli(), 10)
	if err := f.rdb.HSet(ctx, f.prefix+":{held}:run:"+id, "updated", ms).Err(); err != nil {
		t.Fatal(err)
	}
	// 2m0s, or a second or two more on a loaded machine: the status is
	// read by a new process, after the mark was set.
	if out, _, _ := s.run("status", id); !regexp.MustCompile(`\(2m[0-5]s ago: nothing recorded since;`).MatchString(out) || !strings.Contains(out, "pg_stat_activity") {
		t.Errorf("status of a run unchanged for 2m: %q, want it said, with where to look", out)
	}
	if out, _, _ := s.run("status", id, "--json"); !strings.Contains(out, `"stalled": true`) || !strings.Contains(out, `"updated": `) {
		t.Errorf("status --json of a run unchanged for 2m: %q, want stalled and updated", out)
	}

	// The job forbids overlapping runs: a second start is refused, naming the fix.
	if _, errs, code := s.run("run", "held", "--args", `{"n": 1, "page_size": 1}`); code != 1 || !oneLine(errs) ||
		!strings.Contains(errs, "still active") || !strings.Contains(errs, id) || !strings.Contains(errs, "scheduler cancel") {
		t.Errorf("run while a run is active: exit %d, stderr %q; want exit 1 naming the active run and how to stop it", code, errs)
	}

	if out, errs, code := s.run("cancel", id); code != 0 || strings.TrimSpace(out) != "cancelled "+id {
		t.Errorf("cancel: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if got := f.state(id); got != mapreduce.StateCancelled {
		t.Errorf("after cancel the run is %s", got)
	}
	if out, _, _ := s.run("status", id); !strings.Contains(out, "state    cancelled") || !strings.Contains(out, "next     to finish it: scheduler retry "+id) ||
		!strings.Contains(out, "\nargs     {") {
		t.Errorf("status after cancel: %q; want cancelled, naming scheduler retry", out)
	}

	done, err := f.mr.StartJSON(ctx, "sum", []byte(`{"n": 2, "page_size": 1}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.mr.Wait(ctx, done); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := s.run("cancel", done); code != 1 || !oneLine(errs) || !strings.Contains(errs, "already ended (succeeded)") {
		t.Errorf("cancel of a succeeded run: exit %d, stderr %q; want exit 1 saying it already ended", code, errs)
	}
	if _, errs, code := s.run("status", "sum:nosuchkey"); code != 1 || !oneLine(errs) || !strings.Contains(errs, "run not found") {
		t.Errorf("status of an unknown run: exit %d, stderr %q", code, errs)
	}
}

func TestRunsListsEveryJobOrOneAndRefusesAnUnknownJob(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil), sumJob("other", nil))
	_, stop := f.host(nil, sumJob("lost", nil))
	stop()
	s := newScheduler(t, f)
	ctx := context.Background()
	start := func(job string) string {
		id, err := f.mr.StartJSON(ctx, job, []byte(`{"n": 2, "page_size": 1}`), mapreduce.StartOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	sum := start("sum")
	if _, err := f.mr.Wait(ctx, sum); err != nil {
		t.Fatal(err)
	}
	// status --json carries the run's rate, and no time left once it ended.
	if out, errs, code := s.run("status", sum, "--json"); code != 0 || !strings.Contains(out, `"pages_per_second": `) || strings.Contains(out, "remaining_seconds") {
		t.Errorf("status %s --json of a finished run: exit %d, stderr %q; want its pages_per_second and no remaining_seconds:\n%s", sum, code, errs, out)
	}
	// Each run is created after the one before ended: distinct creation
	// times (ms), in order.
	other := start("other")
	if _, err := f.mr.Wait(ctx, other); err != nil {
		t.Fatal(err)
	}
	waiting := start("lost") // no worker: stays splitting

	// rows returns the run IDs a listing shows, in order.
	rows := func(args ...string) []string {
		t.Helper()
		out, errs, code := s.run(append([]string{"runs"}, args...)...)
		ls := lines(out)
		if code != 0 || len(ls) == 0 || !strings.HasPrefix(ls[0], "RUN") {
			t.Fatalf("runs %v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
		var ids []string
		for _, l := range ls[1:] {
			ids = append(ids, strings.Fields(l)[0])
		}
		return ids
	}
	if got, want := rows(), []string{waiting, other, sum}; !slices.Equal(got, want) {
		t.Errorf("runs: %v, want every job's runs newest first: %v", got, want)
	}
	if got := rows("sum"); !slices.Equal(got, []string{sum}) {
		t.Errorf("runs sum: %v, want only %s", got, sum)
	}
	if got := rows("--state", "active"); !slices.Equal(got, []string{waiting}) {
		t.Errorf("runs --state active: %v, want only %s", got, waiting)
	}
	if got := rows("--state", "succeeded"); !slices.Equal(got, []string{other, sum}) {
		t.Errorf("runs --state succeeded: %v, want %s and %s", got, other, sum)
	}
	out, errs, code := s.run("runs", "nosuchjob")
	if code != 1 || out != "" || !oneLine(errs) || !strings.Contains(errs, `no job "nosuchjob"`) || !strings.Contains(errs, "known jobs: lost, other, sum") {
		t.Errorf("runs nosuchjob: exit %d, stdout %q, stderr %q; want exit 1 and one line saying there is no such job", code, out, errs)
	}

	// Under a prefix no worker uses (a BATCHMR_PREFIX or database number
	// that differs from the workers'), the catalogue is empty: every
	// command says where it looked, and what to check.
	lost := s.with("BATCHMR_PREFIX=" + f.prefix + "-typo")
	for _, args := range [][]string{{"jobs"}, {"runs"}, {"run", "sum"}} {
		out, errs, code := lost.run(args...)
		if !oneLine(errs) || !strings.Contains(errs, `under prefix "`+f.prefix+`-typo" in Redis database `) ||
			!strings.Contains(errs, "BATCHMR_PREFIX they use") || out != "" {
			t.Errorf("%v under a prefix no worker uses: exit %d, stdout %q, stderr %q; want one line naming the prefix and database, and what to check",
				args, code, out, errs)
		}
	}

	// A retired job ("lost": its worker stopped) leaves the catalogue once
	// its open run is cancelled; one a live worker runs does not.
	if out, errs, code := s.run("jobs", "forget", "lost"); code != 1 || out != "" || !oneLine(errs) || !strings.Contains(errs, "have not ended ("+waiting+"): cancel them first") {
		t.Errorf("jobs forget lost with a run open: exit %d, stdout %q, stderr %q; want exit 1 naming the run", code, out, errs)
	}
	if _, errs, code := s.run("jobs", "forget", "sum"); code != 1 || !strings.Contains(errs, "live workers run it") {
		t.Errorf("jobs forget sum while a worker runs it: exit %d, stderr %q; want exit 1", code, errs)
	}
	if _, errs, code := s.run("cancel", waiting); code != 0 {
		t.Fatalf("cancel %s: exit %d, %s", waiting, code, errs)
	}
	if out, errs, code := s.run("jobs", "forget", "lost"); code != 0 || strings.TrimSpace(out) != "forgot job lost" || errs != "" {
		t.Errorf("jobs forget lost: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, _, _ := s.run("jobs"); strings.Contains(out, "lost") {
		t.Errorf("scheduler jobs after forgetting lost still lists it:\n%s", out)
	}
}

func TestJobsShowsWhoRunsEachJobAndWarnsOfJobsNobodyRuns(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	live, _ := f.host([]string{"db"}, sumJob("sum", nil))
	gone, stop := f.host(nil, sumJob("lost", nil))
	stop()
	s := newScheduler(t, f)

	out, errs, code := s.run("jobs")
	if code != 0 {
		t.Fatalf("jobs: exit %d, stderr %q", code, errs)
	}
	row := func(job string) []string {
		for _, l := range lines(out) {
			if fs := strings.Fields(l); len(fs) > 0 && fs[0] == job {
				return fs
			}
		}
		t.Fatalf("jobs: no row for %s in\n%s", job, out)
		return nil
	}
	if r := row("sum"); r[1] != f.prefix+":sum" || r[2] != "1" {
		t.Errorf("jobs: sum's row %q, want its queue %s and 1 live worker", r, f.prefix+":sum")
	}
	if r := row("lost"); r[1] != f.prefix+":lost" || r[2] != "0" {
		t.Errorf("jobs: lost's row %q, want its queue and 0 live workers", r)
	}
	if !strings.Contains(out, "main_test.sumArgs {n integer, page_size integer}") {
		t.Errorf("jobs: no description of the arguments in\n%s", out)
	}
	if !strings.Contains(out, live.ID) || strings.Contains(out, gone.ID) {
		t.Errorf("jobs: want the live worker %s listed and the stopped one %s not, in\n%s", live.ID, gone.ID, out)
	}
	warning := "WARNING: no live worker runs lost: its runs will not start until one does"
	if strings.Count(out, warning) != 1 || strings.Count(out, "WARNING") != 1 {
		t.Errorf("jobs: want one warning, for lost (%q), in\n%s", warning, out)
	}

	out, errs, code = s.run("jobs", "--json")
	var got []struct {
		Name       string                  `json:"name"`
		Queue      string                  `json:"queue"`
		JSON       bool                    `json:"json"`
		ArgsSchema json.RawMessage         `json:"args_schema"`
		Workers    *[]mapreduce.WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 2 {
		t.Fatalf("jobs --json: exit %d, %q, stderr %q (%v)", code, out, errs, err)
	}
	lost, sum := got[0], got[1]
	if lost.Name != "lost" || lost.Workers == nil || len(*lost.Workers) != 0 {
		t.Errorf("jobs --json: lost %+v, want an empty list of workers", lost)
	}
	if sum.Name != "sum" || sum.Queue != f.prefix+":sum" || !sum.JSON || len(sum.ArgsSchema) == 0 || sum.Workers == nil ||
		len(*sum.Workers) != 1 || (*sum.Workers)[0].ID != live.ID || !slices.Equal((*sum.Workers)[0].Semaphores, []string{"db"}) {
		t.Errorf("jobs --json: sum %+v, want its queue, schema and its one live worker", sum)
	}
}

func TestPermitsGetAndSetAnySemaphoreAndRefuseUnknownOnes(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host([]string{"db", "cache"}, sumJob("sum", nil))
	s := newScheduler(t, f)

	if out, errs, code := s.run("permits", "set", "db", "5"); code != 0 || strings.TrimSpace(out) != "semaphore db: limit 5 (was none), held 0, 0 waiting" || errs != "" {
		t.Errorf("permits set db 5: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, _, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 5, held 0, 0 waiting") {
		t.Errorf("permits get db: exit %d, %q", code, out)
	}
	// Without NAME: every semaphore a live worker announces, limit or not.
	out, _, code := s.run("permits", "get")
	if got := lines(out); code != 0 || len(got) != 2 || !strings.HasPrefix(got[0], "semaphore cache: no limit set yet") ||
		!strings.HasPrefix(got[1], "semaphore db: limit 5") {
		t.Errorf("permits get: exit %d, %q; want cache (no limit yet) then db", code, out)
	}
	for _, n := range []string{"-1", "0", "zero", "1.5"} {
		_, errs, code := s.run("permits", "set", "db", n)
		if code != 2 || !oneLine(errs) || !strings.Contains(errs, "permits set db "+n+": N must be a whole number of at least 1") {
			t.Errorf("permits set db %s: exit %d, stderr %q; want exit 2 saying N must be a whole number of at least 1", n, code, errs)
		}
	}
	out, errs, code := s.run("permits", "get", "nosuchsem")
	if code != 1 || out != "" || !oneLine(errs) || !strings.Contains(errs, `no semaphore "nosuchsem"`) || !strings.Contains(errs, "in use: cache, db") {
		t.Errorf("permits get nosuchsem: exit %d, stdout %q, stderr %q; want exit 1 saying there is no such semaphore", code, out, errs)
	}
	// A name no worker uses and Redis has no limit for is likely a typo:
	// refused, and nothing is written.
	if out, errs, code := s.run("permits", "set", "later", "3"); code != 1 || out != "" || !oneLine(errs) ||
		!strings.Contains(errs, `no live worker uses a semaphore "later"`) || !strings.Contains(errs, "in use: cache, db") || !strings.Contains(errs, "--new") {
		t.Errorf("permits set later 3: exit %d, stdout %q, stderr %q; want exit 1 naming the semaphores in use and --new", code, out, errs)
	}
	if _, errs, code := s.run("permits", "get", "later"); code != 1 || !strings.Contains(errs, `no semaphore "later"`) {
		t.Errorf("permits get later after a refused set: exit %d, stderr %q; want no such semaphore", code, errs)
	}
	// With --new, a limit set by hand makes a semaphore exist before any
	// worker uses it.
	if out, errs, code := s.run("permits", "set", "later", "3", "--new"); code != 0 || errs != "" || strings.TrimSpace(out) != "semaphore later: limit 3 (was none), held 0, 0 waiting" {
		t.Errorf("permits set later 3 --new: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// "db", every worker's database semaphore, needs no --new: its limit
	// is set before the workers start (make demo does). As no live worker
	// uses it under that prefix, set says so: under the wrong prefix, the
	// running fleet would not see the change.
	db := s.with("BATCHMR_PREFIX=" + f.prefix + "-nodb")
	if out, errs, code := db.run("permits", "set", "db", "3"); code != 0 || !oneLine(errs) ||
		!strings.Contains(errs, `no live worker under BATCHMR_PREFIX="`+f.prefix+`-nodb" uses semaphore db`) || !strings.Contains(errs, "check BATCHMR_PREFIX") ||
		strings.TrimSpace(out) != "semaphore db: limit 3 (was none), held 0, 0 waiting" {
		t.Errorf("permits set db 3 before any worker: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// --new says a limit set before any worker is meant: no warning.
	if out, errs, code := db.run("permits", "set", "db", "4", "--new"); code != 0 || errs != "" || strings.TrimSpace(out) != "semaphore db: limit 4 (was 3), held 0, 0 waiting" {
		t.Errorf("permits set db 4 --new before any worker: exit %d, stdout %q, stderr %q; want no warning", code, out, errs)
	}
	// Once it has a limit, it is known: no --new needed to change it.
	if out, errs, code := s.run("permits", "set", "later", "4"); code != 0 || !strings.Contains(errs, "no live worker under") || strings.TrimSpace(out) != "semaphore later: limit 4 (was 3), held 0, 0 waiting" {
		t.Errorf("permits set later 4: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, errs, code := s.run("permits", "get", "later"); code != 0 || !strings.HasPrefix(out, "semaphore later: limit 4") {
		t.Errorf("permits get later: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestPermitsGetSummarisesEachProcessUnlessVerbose(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newScheduler(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// Two processes' handles: a holds two permits and queues a request of
	// weight 2; b holds one and queues two of weight 1.
	open := func() *semaphore.Semaphore {
		sem, err := semaphore.New(f.rdb, "db", semaphore.Options{Limit: 3, Prefix: f.prefix + ":sem", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sem.Close() })
		return sem
	}
	a, b := open(), open()
	for _, sem := range []*semaphore.Semaphore{a, a, b} {
		if _, err := sem.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []struct {
		sem *semaphore.Semaphore
		n   int
	}{{a, 2}, {b, 1}, {b, 1}} {
		go func() { _, _ = q.sem.AcquireN(ctx, q.n) }()
	}
	var st semaphore.Stats
	testenv.WaitFor(t, 5*time.Second, "three queued requests", func() bool {
		st, _ = a.Stats(ctx)
		return len(st.Waiters) == 3
	})
	procA, procB := st.Holders[0].Process, st.Holders[2].Process

	out, errs, code := s.run("permits", "get", "db")
	got := lines(out)
	if code != 0 || len(got) != 4 || got[0] != "semaphore db: limit 3, held 3, 3 waiting (weight 4), 2 processes" {
		t.Fatalf("permits get db: exit %d, stdout %q, stderr %q; want a summary and one line per process", code, out, errs)
	}
	// PROCESS WORKER HOLDS WEIGHT LONGEST-HOLD WAITS WEIGHT OLDEST-WAIT:
	// no worker runs in this process yet.
	for _, want := range []struct {
		proc                        string
		holds, held, waits, waiting string
	}{{procA, "2", "2", "1", "2"}, {procB, "1", "1", "2", "2"}} {
		i := slices.IndexFunc(got, func(l string) bool { return strings.HasPrefix(l, want.proc+" ") })
		if i < 0 {
			t.Fatalf("permits get db: no line for process %s in\n%s", want.proc, out)
		}
		fs := strings.Fields(got[i])
		if len(fs) != 8 || fs[1] != "(none)" || fs[2] != want.holds || fs[3] != want.held || fs[5] != want.waits || fs[6] != want.waiting {
			t.Errorf("permits get db: %s's line %q, want no worker, holds %s (weight %s), waits %s (weight %s)", want.proc, got[i], want.holds, want.held, want.waits, want.waiting)
		}
	}
	// A worker in this process: its host and pid are the handles'.
	live, _ := f.host([]string{"db"}, sumJob("sum", nil))
	out, _, _ = s.run("permits", "get", "db")
	named := 0
	for _, l := range lines(out) {
		if fs := strings.Fields(l); len(fs) == 8 && (fs[0] == procA || fs[0] == procB) && fs[1] == live.ID {
			named++
		}
	}
	if named != 2 {
		t.Errorf("permits get db: %d of the two processes' lines name worker %s, which runs in them, in\n%s", named, live.ID, out)
	}

	out, _, code = s.run("permits", "get", "db", "--verbose")
	var holds, waits int
	for _, l := range lines(out) {
		switch {
		case strings.HasPrefix(l, "holds "):
			holds++
		case strings.HasPrefix(l, "waits "):
			waits++
		}
	}
	if code != 0 || holds != 3 || waits != 3 || !strings.Contains(out, "LONGEST HOLD") {
		t.Errorf("permits get db --verbose: exit %d, %d holders and %d waiters listed, want the summary and 3 of each:\n%s", code, holds, waits, out)
	}

	// Lowered below the permits held, set says that nobody is granted one
	// until holders finish, and that the request of weight 2 was refused;
	// raised, it shows the two left granted at once.
	out, errs, code = s.run("permits", "set", "db", "1")
	if got := lines(out); code != 0 || errs != "" || len(got) != 3 || got[0] != "semaphore db: limit 1 (was 3), held 3, 2 waiting" ||
		!strings.HasPrefix(got[1], "1 queued request(s) weighed more than 1 and were refused") ||
		!strings.Contains(got[2], "nobody is granted a permit until fewer than 1 are held") {
		t.Errorf("permits set db 1 with 3 held: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	out, errs, code = s.run("permits", "set", "db", "7")
	if code != 0 || errs != "" || strings.TrimSpace(out) != "semaphore db: limit 7 (was 1), held 5, 0 waiting" {
		t.Errorf("permits set db 7 with 3 held and 2 waiting: exit %d, stdout %q, stderr %q; want both granted at once", code, out, errs)
	}
}

// A first deployment starts the scheduler beside its workers (docker
// compose up), so serve may find the catalogue empty: it waits for a
// worker to announce its jobs, then serves, rather than exit 1 and count
// on a restart.
func TestServeWaitsForTheFirstWorkerOfAnEmptyCatalogue(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newScheduler(t, f)
	p := s.start("serve", "--schedule", "sum=@every 1s", "--args", `sum={"n": 10, "page_size": 5}`)
	testenv.WaitFor(t, 10*time.Second, "serve to say it waits for a worker", func() bool {
		return strings.Contains(p.stderr.String(), "no worker has announced a job yet")
	})
	select {
	case <-p.done:
		t.Fatalf("serve exited before any worker announced a job: stderr %q", p.stderr)
	case <-time.After(time.Second):
	}
	f.host(nil, sumJob("sum", nil))
	testenv.WaitFor(t, 15*time.Second, "a scheduled run to succeed", func() bool {
		runs, err := f.mr.Runs(context.Background(), "sum")
		return err == nil && slices.ContainsFunc(runs, func(st *mapreduce.Status) bool { return st.State == mapreduce.StateSucceeded })
	})
	p.interrupt(5 * time.Second)
}

// A tick that finds Redis away is not lost: serve tries again until Redis
// answers (up to the next tick), and the tick's run starts then.
func TestATickDuringARedisOutageStartsItsRunWhenRedisIsBack(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	proxy, proxied := testenv.RedisProxy(t, testenv.RedisURL(t))
	s := newScheduler(t, f).with("REDIS_URL=" + proxied)
	p := s.start("serve", "--schedule", "sum=@every 4s", "--args", `sum={"n": 10, "page_size": 5}`)
	testenv.WaitFor(t, 10*time.Second, "serve to serve", func() bool { return strings.Contains(p.stderr.String(), "serving") })
	proxy.Cut()
	warned := regexp.MustCompile(`could not start the tick's run; retrying until Redis answers.* tick=(\S+)`)
	var tick time.Time
	testenv.WaitFor(t, 10*time.Second, "a tick to find Redis away", func() bool {
		m := warned.FindStringSubmatch(p.stderr.String())
		if m == nil {
			return false
		}
		var err error
		tick, err = time.Parse(time.RFC3339Nano, m[1])
		return err == nil
	})
	// An outage of fixed length, past several of serve's tries (250 ms
	// apart at first): serve cannot be seen trying while Redis is away.
	time.Sleep(1500 * time.Millisecond)
	proxy.Restore()
	id := "sum:" + tick.UTC().Format("20060102T150405Z")
	testenv.WaitFor(t, 10*time.Second, "the tick's run "+id+" to succeed", func() bool { return f.state(id) == mapreduce.StateSucceeded })
	if !strings.Contains(p.stderr.String(), "Redis answers again") {
		t.Errorf("serve did not say that Redis answered again: %q", p.stderr)
	}
	p.interrupt(5 * time.Second)
}

// The schedules serve publishes for the console are republished as each
// tick fires, so the next tick shown is never one that has passed (it was,
// for up to the 5 s between publications).
func TestThePublishedNextTickIsNeverInThePast(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	p := newScheduler(t, f).start("serve", "--schedule", "sum=@every 2s", "--args", `sum={"n": 2, "page_size": 1}`)
	testenv.WaitFor(t, 10*time.Second, "serve to serve", func() bool { return strings.Contains(p.stderr.String(), "serving") })
	ctx := context.Background()
	// It publishes its schedules just after it says it serves.
	testenv.WaitFor(t, 5*time.Second, "the first publication", func() bool {
		list, err := schedules.List(ctx, f.rdb, f.prefix)
		return err == nil && len(list) > 0
	})
	// Watched across three ticks, each of which must move it on.
	var seen []time.Time
	testenv.WaitFor(t, 15*time.Second, "the published next tick to move on three times", func() bool {
		list, err := schedules.List(ctx, f.rdb, f.prefix)
		if err != nil || len(list) != 1 {
			t.Fatalf("the published schedules: %v (%v), want sum's", list, err)
		}
		// Republished as each tick fires, a few ms after it; before, it
		// went stale for up to the 5 s between publications. 1.5 s leaves
		// a loaded machine's late timer and process its slack.
		if late := time.Since(list[0].Next); late > 1500*time.Millisecond {
			t.Fatalf("the published next tick %v passed %v ago", list[0].Next, late.Round(time.Millisecond))
		}
		if len(seen) == 0 || !seen[len(seen)-1].Equal(list[0].Next) {
			seen = append(seen, list[0].Next)
		}
		return len(seen) > 3
	})
}

// Two replicas serving the same schedule start one run per tick: each
// fires every tick, and one of them starts its run.
func TestTwoServingReplicasStartOneRunPerTick(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)

	var replicas []*proc
	for range 2 {
		replicas = append(replicas, s.start("serve", "--schedule", "sum=@every 1s", "--args", `sum={"n": 10, "page_size": 5}`))
	}
	testenv.WaitFor(t, 10*time.Second, "both replicas to serve", func() bool {
		return strings.Contains(replicas[0].stderr.String(), "serving") && strings.Contains(replicas[1].stderr.String(), "serving")
	})
	// Counted against the ticks the replicas logged, not against the
	// clock: on a loaded machine a replica starts a tick or two late.
	tickOf := regexp.MustCompile(`tick=(\S+)`)
	// fired returns, by tick, how many replicas started its run and how
	// many fired it, and how many ticks both fired.
	fired := func() (started, both map[string]int, shared int) {
		started, both = map[string]int{}, map[string]int{}
		for _, p := range replicas {
			for _, l := range lines(p.stderr.String()) {
				m := tickOf.FindStringSubmatch(l)
				switch {
				case m == nil:
				case strings.Contains(l, "scheduler: started a run"):
					started[m[1]]++
					both[m[1]]++
				case strings.Contains(l, "started by another replica"), strings.Contains(l, "the tick's run exists"):
					both[m[1]]++
				}
			}
		}
		for _, n := range both {
			if n == 2 {
				shared++
			}
		}
		return started, both, shared
	}
	// Three ticks both fired; fewer fail below, with the replicas' logs.
	testenv.Eventually(15*time.Second, func() bool { _, _, shared := fired(); return shared >= 3 })
	for _, p := range replicas {
		p.interrupt(5 * time.Second)
	}
	// The last tick's run may still be going.
	testenv.WaitFor(t, 5*time.Second, "every run to end", func() bool {
		runs, err := f.mr.Runs(context.Background(), "sum")
		return err == nil && !slices.ContainsFunc(runs, func(st *mapreduce.Status) bool { return !st.State.Ended() })
	})
	out, _, _ := s.run("runs", "sum")
	runs := lines(out)[1:]
	started, _, shared := fired()
	for tick, n := range started {
		if n != 1 {
			t.Errorf("%d replicas started a run for the tick %s, want one", n, tick)
		}
	}
	if shared < 2 || len(runs) != len(started) {
		t.Fatalf("two replicas made %d runs for %d ticks, %d of which both fired, want one run per tick and at least two ticks both fired:\n%s\nreplica 0:\n%s\nreplica 1:\n%s",
			len(runs), len(started), shared, out, replicas[0].stderr, replicas[1].stderr)
	}
	tick := regexp.MustCompile(`^sum:\d{8}T\d{6}Z\s+succeeded\s+2/2 done`)
	for _, r := range runs {
		if !tick.MatchString(r) {
			t.Errorf("not a succeeded run of both pages named after its tick: %s", r)
		}
	}
}

// A Redis outage does not end 'run --wait': the run goes on without the
// scheduler, which says so once and follows it again when Redis is back.
func TestRunWaitKeepsFollowingThroughARedisOutage(t *testing.T) {
	t.Parallel()
	f, p, cmd, id, release := waitingBehindACutProxy(t)
	unreachable := "cannot reach the Redis server at " + p.Addr()
	testenv.WaitFor(t, 5*time.Second, "the scheduler to say Redis is unreachable", func() bool { return strings.Contains(cmd.stderr.String(), unreachable) })
	said := time.Now()
	// The run ends while the scheduler cannot see it.
	release()
	testenv.WaitFor(t, 5*time.Second, "the run to succeed", func() bool { return f.state(id) == mapreduce.StateSucceeded })
	// An outage of fixed length, for several more failed polls (go-redis
	// spends up to 1.7s failing each of the first few), which the
	// scheduler's output cannot show while they happen.
	time.Sleep(time.Until(said.Add(4 * time.Second)))
	p.Restore()

	code := cmd.wait(10 * time.Second)
	out, errs := cmd.stdout.String(), cmd.stderr.String()
	if code != 0 || !slices.Equal(lines(out), []string{id, "55"}) {
		t.Errorf("run --wait across an outage: exit %d, stdout %q, stderr %q; want exit 0, the ID and the result 55", code, out, errs)
	}
	if n := strings.Count(errs, unreachable); n != 1 || !strings.Contains(errs, "the run goes on: still following "+id+" until Redis is back") {
		t.Errorf("run --wait said Redis was unreachable %d times, want once, saying the run goes on:\n%s", n, errs)
	}
	if !strings.Contains(errs, "is back; following "+id) || !strings.Contains(errs, id+" succeeded") {
		t.Errorf("run --wait: stderr does not say Redis came back and the run succeeded:\n%s", errs)
	}
}

// Ctrl-C while Redis is unreachable stops the following at once, not the run.
func TestInterruptingRunWaitDuringAnOutageLeavesTheRunGoing(t *testing.T) {
	t.Parallel()
	f, _, cmd, id, _ := waitingBehindACutProxy(t)
	testenv.WaitFor(t, 5*time.Second, "the scheduler to say Redis is unreachable", func() bool {
		return strings.Contains(cmd.stderr.String(), "cannot reach the Redis server")
	})
	_ = cmd.cmd.Process.Signal(os.Interrupt)
	if code := cmd.wait(2 * time.Second); code != 130 || !strings.Contains(cmd.stderr.String(), "stopped following "+id+" (the run goes on)") {
		t.Errorf("SIGINT during an outage: exit %d, stderr %q; want exit 130 saying the run goes on", code, cmd.stderr)
	}
	if st := f.state(id); st.Ended() {
		t.Errorf("the run is %s after the scheduler stopped following it; want it still going", st)
	}
}

func TestRedisErrorsSayWhetherTheServerAnswered(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newScheduler(t, f)
	u, err := url.Parse(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/99"
	_, errs, code := s.run("status", "x:y", "--redis-url", u.String())
	if code != 1 || !oneLine(errs) || !strings.Contains(errs, "the Redis server at "+u.Host+" refused: ERR DB index is out of range") ||
		strings.Contains(errs, "does not answer") || strings.Contains(errs, "cannot reach") {
		t.Errorf("a server that refused: exit %d, stderr %q; want exit 1 saying it refused, with its answer", code, errs)
	}
	_, errs, code = s.run("status", "x:y", "--redis-url", "redis://127.0.0.1:1/0")
	if code != 1 || !oneLine(errs) || !strings.Contains(errs, "cannot reach the Redis server at 127.0.0.1:1") || strings.Contains(errs, "refused:") {
		t.Errorf("a server that is not there: exit %d, stderr %q; want exit 1 saying it cannot be reached", code, errs)
	}
}

// Bad command lines: one clear line, exit 2; a world the command cannot
// work with (a job nobody announced): one clear line, exit 1.
func TestBadInputGetsOneLineAndANonZeroExit(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"run"}, 2, "missing JOB"},
		{[]string{"run", "sum", "--bogus"}, 2, "-bogus"},
		{[]string{"run", "sum", "--page_size", "5"}, 2, `flag provided but not defined: -page_size: a job's arguments go in --args, as JSON`},
		{[]string{"run", "sum", "--args", `{"n": 1`}, 2, "is not JSON"},
		{[]string{"run", "sum", "--args", `{n: 1}`}, 2, "is not JSON (invalid character 'n' looking for beginning of object key string, at byte 2): keys and strings take double quotes"},
		{[]string{"status", "not-a-run"}, 1, "<job>:<key>"},
		{[]string{"runs", "--state", "done"}, 2, `--state "done": use one of splitting, mapping`},
		{[]string{"permits", "get", "db", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"permits", "frob"}, 2, "use get, set or auto"},
		{[]string{"serve", "--schedule", "sum=@every 1ms"}, 2, "at least 1s"},
		{[]string{"serve", "--schedule", "sum=61 * * * *"}, 2, "not a cron spec"},
		{[]string{"serve", "--schedule", "nope=@daily"}, 1, `no job "nope": no worker has announced one by that name (known jobs: sum): check the name, or start a worker that runs it`},
		{[]string{"serve", "--schedule", "sum=@daily", "--args", `sum={"pagesize": 1}`}, 2, `unknown field "pagesize"`},
		{[]string{"serve", "--schedule", "sum=@daily", "--args", `sum={"n": `}, 2, "is not JSON"},
		// The live worker runs the job's own Validate at start-up.
		{[]string{"serve", "--schedule", "sum=@daily", "--args", `sum={"n": 5, "page_size": -5}`}, 2, `invalid arguments for job "sum": page_size -5: use at least 1`},
		{[]string{"serve", "--schedule", "sum=@daily", "--args", `other={}`}, 2, "other has no --schedule"},
		{[]string{"serve", "--schedule", "sum=@daily", "--log-level", "verbose"}, 2, `--log-level "verbose" (env LOG_LEVEL): use debug, info, warn or error`},
		{[]string{"serve", "--schedule", "sum=@daily", "--log-format", "xml"}, 2, `--log-format "xml" (env LOG_FORMAT): use text or json`},
		{[]string{"ui", "--log-level", "loud"}, 2, `--log-level "loud" (env LOG_LEVEL): use debug, info, warn or error`},
		{[]string{"ui", "--listen", "47813"}, 2, `give HOST:PORT, e.g. 127.0.0.1:8080`},
		{[]string{"--redis-url", "redis://x:1/0", "jobs"}, 2, "the command comes first and its flags after it, e.g. scheduler jobs --redis-url"},
		{[]string{"permits", "set", "db"}, 2, "missing N, the new limit"},
		{[]string{"permits", "set"}, 2, "missing NAME and N"},
	} {
		_, errs, code := s.run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) || !oneLine(errs) {
			t.Errorf("scheduler %q: exit %d, stderr %q; want exit %d and one line saying %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

func TestEveryCommandsHelpHasAnExample(t *testing.T) {
	t.Parallel()
	s := newScheduler(t, newFleet(t))
	for _, args := range [][]string{{"--help"}, {"jobs", "--help"}, {"run", "--help"}, {"serve", "--help"},
		{"status", "--help"}, {"runs", "--help"}, {"cancel", "--help"}, {"retry", "--help"}, {"permits", "--help"}} {
		out, _, code := s.run(args...)
		if code != 0 || !strings.Contains(out, "Example") {
			t.Errorf("scheduler %v: exit %d, no example in %q", args, code, out)
		}
		for _, stale := range []string{"bundled", "BATCHMR_QUEUE"} {
			if strings.Contains(out, stale) {
				t.Errorf("scheduler %v mentions %s:\n%s", args, stale, out)
			}
		}
	}
	if out, _, _ := s.run("--help"); !strings.Contains(out, "scheduler jobs [--json]") {
		t.Errorf("scheduler --help does not list the jobs command:\n%s", out)
	}
}

// waitingBehindACutProxy starts 'run --wait' of a run held at its first
// page, through a proxy to Redis, then cuts the proxy. release lets the
// run finish.
func waitingBehindACutProxy(t *testing.T) (f *fleet, p *testenv.Proxy, cmd *proc, id string, release func()) {
	t.Helper()
	f = newFleet(t)
	held, release := gate(t)
	f.host(nil, sumJob("sum", held))
	p, proxied := testenv.RedisProxy(t, testenv.RedisURL(t))
	s := newScheduler(t, f).with("REDIS_URL=" + proxied)
	cmd = s.start("run", "sum", "--args", `{"n": 10, "page_size": 10}`, "--wait")
	testenv.WaitFor(t, 10*time.Second, "the run's ID", func() bool {
		id, _, _ = strings.Cut(cmd.stdout.String(), "\n")
		return strings.HasPrefix(id, "sum:")
	})
	p.Cut()
	return f, p, cmd, id, release
}

// The scheduler says which batchmr it was built with: it must be kept at
// the workers' release (docs/operations.md, upgrades).
func TestVersionPrintsTheBatchmrVersionItWasBuiltWith(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(schedulerBinary(t), arg).Output()
		if err != nil || !strings.HasPrefix(string(out), "scheduler: batchmr ") || !strings.Contains(string(out), runtime.Version()) {
			t.Errorf("scheduler %s: %v, %q; want exit 0 and the batchmr and Go versions", arg, err, out)
		}
	}
}

// Workers that run two versions of a job's code (its arguments changed in
// a deploy) are named in a warning, with what to do.
func TestJobsWarnsOfWorkersThatRunAnotherVersionOfAJob(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	old, _ := f.host(nil, sumJob("sum", nil))
	type renamedArgs struct {
		Count int `json:"count"`
	}
	other := mapreduce.Job[renamedArgs, [2]int, int, int]{
		Name:  "sum",
		Split: func(context.Context, renamedArgs, func([2]int) error) error { return nil },
		Map:   func(context.Context, [2]int) (int, error) { return 0, nil },
	}
	nw, _ := f.host(nil, other)
	s := newScheduler(t, f)
	out, errs, code := s.run("jobs")
	if code != 0 {
		t.Fatalf("jobs: exit %d, stderr %q", code, errs)
	}
	var warning string
	for _, l := range lines(out) {
		if strings.HasPrefix(l, "WARNING: workers run two versions of sum") {
			warning = l
		}
	}
	// The entry is the newest announcement: the warning names whichever
	// worker differs from it.
	if !strings.Contains(warning, "finish the deploy") || strings.Contains(warning, old.ID) == strings.Contains(warning, nw.ID) {
		t.Errorf("jobs: want a warning of two versions of sum naming one of %s and %s, in\n%s", old.ID, nw.ID, out)
	}
}

// A split that fails and retries shows nothing but its error: 'run --wait'
// prints it as it happens, and 'status' and 'status --json' show it.
func TestRunWaitAndStatusShowAStepsFailedAttempt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	var failures atomic.Int32
	job := sumJob("flaky", nil)
	split := job.Split
	job.Split = func(ctx context.Context, a sumArgs, emit func([2]int) error) error {
		if failures.Add(1) <= 2 {
			return errors.New(`relation "events" does not exist`)
		}
		return split(ctx, a, emit)
	}
	job.Options = mapreduce.JobOptions{StepRetries: 3, Backoff: func(int, error) time.Duration { return time.Second }}
	f.host(nil, job)
	s := newScheduler(t, f)
	out, errs, code := s.run("run", "flaky", "--args", `{"n": 10, "page_size": 5}`, "--wait")
	if code != 0 || !strings.Contains(errs, `split failed at `) || !strings.Contains(errs, `relation "events" does not exist`) {
		t.Fatalf("run --wait: exit %d, stderr %q; want the split's failure shown, then success", code, errs)
	}
	id := lines(out)[0]
	if out, _, _ := s.run("status", id); !strings.Contains(out, "last err split failed at ") || !strings.Contains(out, `relation "events" does not exist`) {
		t.Errorf("status: want the split's last failure in\n%s", out)
	}
	out, _, _ = s.run("status", id, "--json")
	var js struct {
		LastError struct{ Step, Error string } `json:"last_error"`
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil || js.LastError.Step != "split" || !strings.Contains(js.LastError.Error, "does not exist") {
		t.Errorf("status --json: %v, %s; want last_error with the split's", err, out)
	}
}

// A worker that runs a job without a database, where others of the job
// have one, is named: the pages it takes go back to the queue.
func TestJobsWarnsOfAWorkerWithoutTheDatabaseItsJobsUse(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	with, without := true, false
	host := func(db *bool, job mapreduce.AnyJob) mapreduce.WorkerInfo {
		info, _ := testhost.Host(t, f.rdb, testhost.Options{Prefix: f.prefix, Database: db, Logger: quiet}, job)
		return info
	}
	host(&with, sumJob("sum", nil))
	bare := host(&without, sumJob("sum", nil))
	host(nil, sumJob("sum", nil))       // says nothing: left out
	host(&without, sumJob("nodb", nil)) // no worker of it has one: nothing to say
	s := newScheduler(t, f)
	out, errs, code := s.run("jobs")
	var warnings []string
	for _, l := range lines(out) {
		if strings.Contains(l, "without a database") {
			warnings = append(warnings, l)
		}
	}
	if code != 0 || len(warnings) != 1 || !strings.Contains(warnings[0], "worker "+bare.ID+" runs sum without a database") || !strings.Contains(warnings[0], "DATABASE_URL") {
		t.Errorf("jobs: exit %d, warnings %q (stderr %q); want one, naming worker %s and job sum", code, warnings, errs, bare.ID)
	}
}
