package tutorialtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/format"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tutorial is the page under test, and job the job it builds.
const (
	tutorial = "../../../docs/first-job.md"
	job      = "count-kinds"
)

// The files the test needs from the tutorial. It writes every file block
// the page has; these it uses.
var needed = []string{"countkinds/countkinds.go", "cmd/worker/main.go", "cmd/start/main.go", "events.sql", "Dockerfile"}

// docs/first-job.md, followed by a user: its files make a module of their
// own that requires batchmr (replaced by this repository), built the way
// its Dockerfile builds it; two of its workers run, and the scheduler
// commands of the page list the job with both workers, refuse bad
// arguments at once, run the job to the result one SQL query gives, start
// it on a schedule, cancel a run and resume it to the same result; the
// page's Go program starts it, typed, to the same result; both workers
// exit 0 on SIGTERM.
func TestFirstJobTutorialRunsOnTwoWorkersUnderTheScheduler(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	files := tutorialFiles(t, tutorial)
	bin := buildModule(ctx, t, files)

	pool, schema := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, job)
	if _, err := pool.Exec(ctx, string(files["events.sql"])); err != nil {
		t.Fatalf("events.sql: %v", err)
	}
	want := countBySQL(ctx, t, pool)
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, ctx: ctx, bin: bin, env: append(os.Environ(),
		"REDIS_URL="+testenv.RedisURL(t),
		"DATABASE_URL="+testenv.DatabaseURLIn(t, schema),
		"BATCHMR_PREFIX="+prefix)}

	// Step 5: two workers; the catalogue lists the job, in its own queue,
	// with both.
	workers := []*proc{
		f.start("worker", "--poll-interval", "50ms", "--log-level", "warn"),
		f.start("worker", "--poll-interval", "50ms", "--log-level", "warn"),
	}
	waitFor(t, 30*time.Second, "both workers to announce "+job, func() (bool, string) {
		info, err := mr.Job(ctx, job)
		return err == nil && len(info.Workers) == 2, fmt.Sprintf("%+v %v", info, err)
	})
	jobs := f.scheduler("jobs", "--json")
	type listedJob struct {
		Name    string `json:"name"`
		Queue   string `json:"queue"`
		Workers []struct {
			ID string `json:"id"`
		} `json:"workers"`
	}
	var catalogue []listedJob
	if jobs.code != 0 || json.Unmarshal([]byte(jobs.stdout), &catalogue) != nil {
		t.Fatalf("scheduler jobs --json: want exit 0 and JSON, got\n%s", jobs)
	}
	if i := slices.IndexFunc(catalogue, func(j listedJob) bool { return j.Name == job }); i < 0 ||
		catalogue[i].Queue != prefix+":"+job || len(catalogue[i].Workers) != 2 {
		t.Fatalf("scheduler jobs --json does not list %s in its own queue %q with its 2 workers:\n%s", job, prefix+":"+job, jobs.stdout)
	}
	listed := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(job) + ` +` + regexp.QuoteMeta(prefix+":"+job) + ` +2 `)
	if r := f.scheduler("jobs"); r.code != 0 || !listed.MatchString(r.stdout) {
		t.Errorf("scheduler jobs does not list %s in its queue:\n%s", job, r)
	}

	// Step 7: bad arguments are refused at once, and create nothing.
	for args, msg := range map[string]string{
		`{"page_size": -1}`:  "page_size -1: use a positive number of rows per page",
		`{"pagesize": 1000}`: `unknown field "pagesize"`,
	} {
		r := f.scheduler("run", job, "--args", args)
		if r.code != 1 || !strings.Contains(r.stderr, msg) {
			t.Errorf("scheduler run %s --args '%s': want exit 1 saying %q, got\n%s", job, args, msg, r)
		}
	}
	if runs, err := mr.Runs(ctx, job); err != nil || len(runs) != 0 {
		t.Errorf("refused starts created runs: %d (%v)", len(runs), err)
	}

	// Step 6: a run, followed to its result.
	r := f.scheduler("run", job, "--args", `{"page_size": 500}`, "--wait")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], job+":") {
		t.Fatalf("scheduler run --wait: want exit 0, the run ID and the result on stdout, got\n%s", r)
	}
	var got map[string]int64
	if err := json.Unmarshal([]byte(lines[1]), &got); err != nil || !maps.Equal(got, want) {
		t.Errorf("scheduler run --wait printed %s (%v), want the counts of SQL's GROUP BY: %v", lines[1], err, want)
	}
	if r := f.scheduler("runs", job); r.code != 0 || !regexp.MustCompile(regexp.QuoteMeta(lines[0])+` +succeeded`).MatchString(r.stdout) {
		t.Errorf("scheduler runs %s does not list %s as succeeded:\n%s", job, lines[0], r)
	}

	// Step 10: the page's Go program starts a run, typed, and decodes it.
	if r := f.run("start"); r.code != 0 {
		t.Errorf("cmd/start failed:\n%s", r)
	} else if got := parseCounts(r.stdout); !maps.Equal(got, want) {
		t.Errorf("cmd/start printed\n%s\nwant the counts of SQL's GROUP BY: %v", r.stdout, want)
	}

	// Step 8: scheduler serve refuses, when it starts, a schedule whose
	// runs the job would refuse, and starts runs on a schedule.
	if r := f.scheduler("serve", "--schedule", job+"=0 2 * * *"); r.code == 0 || !strings.Contains(r.stderr, "page_size 0: use a positive number") {
		t.Errorf("scheduler serve without --args: want it refused at start-up with the job's Validate message, got\n%s", r)
	}
	before := runIDs(ctx, t, mr)
	serve := f.start("scheduler", "serve", "--schedule", job+"=@every 1s", "--args", job+`={"page_size": 500}`)
	var scheduled string
	waitFor(t, 30*time.Second, "scheduler serve to start a run", func() (bool, string) {
		for _, id := range runIDs(ctx, t, mr) {
			if !slices.Contains(before, id) {
				scheduled = id
				return true, ""
			}
		}
		return false, serve.output()
	})
	serve.stop(t)
	for _, id := range runIDs(ctx, t, mr) { // a second tick may have started one more
		st, err := mr.Wait(ctx, id)
		if err != nil {
			t.Fatalf("waiting for %s: %v", id, err)
		}
		if id == scheduled {
			if err := json.Unmarshal(st.Result, &got); st.State != mapreduce.StateSucceeded || err != nil || !maps.Equal(got, want) {
				t.Errorf("scheduled run %s: %s, result %s (%v), want succeeded with %v", id, st.State, st.Result, err, want)
			}
		}
	}

	// Step 9: a run held back — the test holds every database permit, so
	// its split waits for one — is cancelled, and its split stops waiting.
	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 8, Prefix: prefix + ":sem"})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	stats, err := sem.Stats(ctx)
	if err != nil || stats.Limit < 1 {
		t.Fatalf("the workers' db semaphore: %+v, %v", stats, err)
	}
	all, err := sem.AcquireN(ctx, stats.Limit)
	if err != nil {
		t.Fatal(err)
	}
	r = f.scheduler("run", job, "--args", `{"page_size": 500}`)
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(id, job+":") {
		t.Fatalf("scheduler run: want exit 0 and the run ID, got\n%s", r)
	}
	waitFor(t, 30*time.Second, "the run's split to wait for a permit", func() (bool, string) {
		st, err := sem.Stats(ctx)
		return err == nil && len(st.Waiters) == 1, fmt.Sprintf("%+v %v", st, err)
	})
	if r := f.scheduler("status", id); r.code != 0 || !strings.Contains(r.stdout, "state    splitting") {
		t.Errorf("scheduler status %s: want the state splitting, got\n%s", id, r)
	}
	if r := f.scheduler("cancel", id); r.code != 0 || strings.TrimSpace(r.stdout) != "cancelled "+id {
		t.Errorf("scheduler cancel %s: want exit 0 and %q, got\n%s", id, "cancelled "+id, r)
	}
	waitFor(t, 30*time.Second, "the cancelled split to stop waiting for a permit", func() (bool, string) {
		st, err := sem.Stats(ctx)
		return err == nil && len(st.Waiters) == 0, fmt.Sprintf("%+v %v", st, err)
	})
	if err := all.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r = f.scheduler("status", id, "--json")
	var st struct {
		State string `json:"state"`
		Done  int    `json:"done"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.State != "cancelled" || st.Done != 0 {
		t.Errorf("scheduler status %s --json: want cancelled with no page done, got\n%s", id, r)
	}
	// Step 9, continued: the cancelled run, resumed, ends with the result.
	r = f.scheduler("retry", id, "--wait")
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "resuming "+id+" (cancelled)") {
		t.Fatalf("scheduler retry %s --wait: want exit 0, what it resumes and the result on stdout, got\n%s", id, r)
	}
	var resumed map[string]int64
	if err := json.Unmarshal([]byte(lines[1]), &resumed); err != nil || !maps.Equal(resumed, want) {
		t.Errorf("scheduler retry --wait printed %s (%v), want the counts of SQL's GROUP BY: %v", lines[1], err, want)
	}

	// Both workers stop cleanly on SIGTERM.
	for _, w := range workers {
		w.stop(t)
	}
}

// tutorialFiles returns the tutorial's file blocks by path: each is a
// fenced block right after a line "<!-- file: PATH -->". Go files must be
// gofmt'd, as a user's editor would leave them.
func tutorialFiles(t *testing.T, page string) map[string][]byte {
	t.Helper()
	src, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	marker := regexp.MustCompile(`^<!-- file: (\S+) -->$`)
	files := map[string][]byte{}
	lines := strings.Split(string(src), "\n")
	for i := 0; i < len(lines); i++ {
		m := marker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		name := m[1]
		at := fmt.Sprintf("%s:%d", page, i+1)
		if path.Clean(name) != name || path.IsAbs(name) || strings.HasPrefix(name, "../") {
			t.Fatalf("%s: file %q: use a clean path inside the module", at, name)
		}
		if _, dup := files[name]; dup {
			t.Fatalf("%s: a second block for %s", at, name)
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Fatalf("%s: the line after the marker of %s must open a fenced block", at, name)
		}
		var body []string
		for i += 2; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("%s: the block of %s is never closed", at, name)
		}
		files[name] = []byte(strings.Join(body, "\n") + "\n")
		if strings.HasSuffix(name, ".go") {
			if formatted, err := format.Source(files[name]); err != nil {
				t.Errorf("%s: %s does not parse: %v", at, name, err)
			} else if !bytes.Equal(formatted, files[name]) {
				t.Errorf("%s: %s is not gofmt'd; gofmt gives:\n%s", at, name, formatted)
			}
		}
	}
	for _, name := range needed {
		if files[name] == nil {
			t.Fatalf("%s has no block for %s (a line <!-- file: %s --> before its fenced block): the test builds and runs it", page, name, name)
		}
	}
	return files
}

// buildModule writes files as the module example.com/reports — batchmr
// required and replaced by this repository, and its scheduler a tool of
// the module, as the tutorial's first step makes it — vets it, and builds
// what its Dockerfile builds, and cmd/start, into a directory it returns.
//
// Everything comes from the local module cache (GOPROXY=off): the module
// starts from this repository's own requirements and go.sum, which
// 'go mod download' has cached, and 'go mod tidy' trims them to what the
// tutorial's code uses. tidy runs with -e because it also looks for the
// test dependencies of the modules it keeps, which no build needs and no
// cache has to hold; the vet and the builds that follow fail on anything
// the code itself is missing.
func buildModule(ctx context.Context, t *testing.T, files map[string][]byte) string {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	repoMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	requires := ""
	if i := bytes.Index(repoMod, []byte("\nrequire")); i >= 0 {
		requires = string(repoMod[i:])
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files = maps.Clone(files)
	files["go.mod"] = fmt.Appendf(nil, `module example.com/reports

go 1.26.0

require github.com/batchmr/batchmr v0.0.0

replace github.com/batchmr/batchmr => %s

tool github.com/batchmr/batchmr/cmd/scheduler
%s`, root, requires)
	files["go.sum"] = gosum
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "GOPROXY=off", "GOSUMDB=off", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"))
	gocmd := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("in the tutorial's module: go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	gocmd("mod", "tidy", "-e")
	gocmd("vet", "./...")

	// What the Dockerfile builds: each "-o /out/NAME PACKAGE" of its go build lines.
	builds := regexp.MustCompile(`go build [^\n]*?-o /out/(\S+) (\S+)`).FindAllStringSubmatch(string(files["Dockerfile"]), -1)
	bin := filepath.Join(dir, "bin")
	built := []string{}
	for _, b := range builds {
		gocmd("build", "-o", filepath.Join(bin, b[1]), b[2])
		built = append(built, b[1])
	}
	for _, name := range []string{"worker", "scheduler"} {
		if !slices.Contains(built, name) {
			t.Fatalf("the tutorial's Dockerfile builds %v, not /out/%s: the image needs it", built, name)
		}
	}
	gocmd("build", "-o", filepath.Join(bin, "start"), "./cmd/start")
	return bin
}

// countBySQL is the answer: one GROUP BY.
func countBySQL(ctx context.Context, t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT kind, count(*) FROM events GROUP BY kind`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	var kind string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&kind, &n}, func() error { want[kind] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(want) < 2 {
		t.Fatalf("events.sql makes %d kinds of events: the test needs a few", len(want))
	}
	return want
}

// parseCounts reads cmd/start's "kind<TAB>count" lines.
func parseCounts(out string) map[string]int64 {
	got := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		kind, n, ok := strings.Cut(sc.Text(), "\t")
		v, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil {
			return nil
		}
		got[kind] = v
	}
	return got
}

func runIDs(ctx context.Context, t *testing.T, mr *mapreduce.Client) []string {
	t.Helper()
	runs, err := mr.Runs(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	return ids
}

// waitFor polls cond until it holds, failing the test after limit with
// what cond last said.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	if !testenv.Eventually(limit, func() bool {
		var ok bool
		ok, last = cond()
		return ok
	}) {
		t.Fatalf("waited %v for %s; last:\n%s", limit, what, last)
	}
}

// fleet runs the tutorial's binaries with the test's servers and prefix.
type fleet struct {
	t   *testing.T
	ctx context.Context
	bin string
	env []string
}

// result is what a command that ran to its end printed, and its exit code.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("$ %s\nexit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

func (f *fleet) scheduler(args ...string) result { return f.run("scheduler", args...) }

// run runs a binary to its end; the test's context bounds it.
func (f *fleet) run(name string, args ...string) result {
	f.t.Helper()
	cmd := exec.CommandContext(f.ctx, filepath.Join(f.bin, name), args...)
	cmd.Env = f.env
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{args: append([]string{name}, args...), stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && f.ctx.Err() == nil:
		r.code = exit.ExitCode()
	case err != nil:
		f.t.Fatalf("%s: %v\n%s", strings.Join(r.args, " "), err, r)
	}
	return r
}

// proc is a long-running subprocess: a worker, scheduler serve.
type proc struct {
	cmd  *exec.Cmd
	out  *testenv.LogBuffer
	done chan struct{} // closed once it has exited
}

// start starts a binary in the background; the test's end kills it if it
// is still running.
func (f *fleet) start(name string, args ...string) *proc {
	f.t.Helper()
	p := &proc{cmd: exec.Command(filepath.Join(f.bin, name), args...), out: &testenv.LogBuffer{}, done: make(chan struct{})}
	p.cmd.Env = f.env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = dieWithTest()
	if err := p.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	f.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if f.t.Failed() {
			f.t.Logf("%s %s printed:\n%s", name, strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

// stop sends SIGTERM and fails the test unless the process exits 0 within
// 30 seconds.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30s of SIGTERM:\n%s", p.cmd, p.out.String())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited %d on SIGTERM, want 0:\n%s", p.cmd, code, p.out.String())
	}
}

func (p *proc) output() string { return p.out.String() }
