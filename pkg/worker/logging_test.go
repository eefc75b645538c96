package worker_test

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/mapreduce/pgsource"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// What a job's Split, Map and Reduce log through worker.Logger(ctx) says
// which run, job, step, page and attempt it is about, and which asynq task:
// one query over the worker's logs finds every line of a page, retries
// included. The worker's own lines and asynq's come through the same
// handler, at its level (here debug, so asynq's debug records too).
func TestAJobsFunctionsLogWithTheirRunJobStepPageAttemptAndTask(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const name = "stamped"
	testenv.JobQueue(t, rdb, prefix, name)
	var failedOnce atomic.Bool
	job := mapreduce.Job[int, int, int, int]{
		Name: name,
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			worker.Logger(ctx).Info("stamped: split")
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(ctx context.Context, p int) (int, error) {
			worker.Logger(ctx).Info("stamped: mapped", "value", p)
			if p == 1 && failedOnce.CompareAndSwap(false, true) {
				return 0, errors.New("page 1 fails its first attempt")
			}
			return p, nil
		},
		Reduce: func(ctx context.Context, _ int, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			worker.Logger(ctx).Info("stamped: reduced")
			return 0, nil
		},
		Options: mapreduce.JobOptions{MapRetries: 2, Backoff: func(int, error) time.Duration { return 10 * time.Millisecond }},
	}
	var logs testenv.LogBuffer
	id := runToSuccess(t, worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix, Concurrency: 2,
		PollInterval: 20 * time.Millisecond,
		Logger:       slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, job, 3)

	steps := map[string]int{}
	attempts := map[float64][]float64{} // page -> attempts that logged "mapped"
	var asynqDebug, workerStarted bool
	done := map[float64]int{} // page -> "done" records
	for _, r := range logs.Records(t) {
		switch msg, _ := r["msg"].(string); {
		case strings.HasPrefix(msg, "stamped: "):
			step, _ := r["step"].(string)
			steps[step]++
			task, _ := r["task"].(string)
			if r["run"] != id || r["job"] != name || task == "" || r["attempt"] == nil {
				t.Errorf("a job's record without its run, job, task or attempt: %v", r)
			}
			want := map[string]string{"stamped: split": "split", "stamped: mapped": "map", "stamped: reduced": "reduce"}[msg]
			if step != want {
				t.Errorf("%q logged with step %q, want %q: %v", msg, step, want, r)
			}
			if step == "map" {
				page, _ := r["page"].(float64)
				if page != r["value"] {
					t.Errorf("page %v's Map logged with page %v", r["value"], r["page"])
				}
				attempts[page] = append(attempts[page], r["attempt"].(float64))
			} else if _, ok := r["page"]; ok {
				t.Errorf("%s logged with a page: %v", step, r)
			}
		case msg == "mapreduce: page failed; retrying":
			if r["run"] != id || r["page"] != 1.0 || r["attempt"] != 1.0 || r["error"] == nil {
				t.Errorf("the page's failure logged as %v; want run, page 1, attempt 1 and the error", r)
			}
		case msg == "mapreduce: page done":
			page, _ := r["page"].(float64)
			done[page]++
			if r["level"] != "DEBUG" || r["run"] != id || r["took"] == nil {
				t.Errorf("a page's end logged as %v; want debug, with its run and how long it took", r)
			}
		case msg == "worker: started":
			workerStarted = true
			if _, ok := r["run"]; ok {
				t.Errorf("the worker's own record carries a run: %v", r)
			}
		case r["component"] == "asynq" && r["level"] == "DEBUG":
			asynqDebug = true
		}
	}
	if steps["split"] != 1 || steps["map"] != 4 || steps["reduce"] != 1 {
		t.Errorf("records by step: %v; want 1 split, 4 map (3 pages, one retried), 1 reduce", steps)
	}
	if len(done) != 3 || done[0] != 1 || done[1] != 1 || done[2] != 1 {
		t.Errorf("pages logged done: %v; want each of 0, 1, 2 once, at debug", done)
	}
	if got := attempts[1]; len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("page 1 logged attempts %v, want [1 2]", got)
	}
	if !workerStarted || !asynqDebug {
		t.Errorf("at debug level, want the worker's records and asynq's debug records through the same logger (started: %v, asynq debug: %v)", workerStarted, asynqDebug)
	}
}

// Outside a job's steps, worker.Logger is the worker's logger as it is,
// with no run attributes; outside a worker, slog.Default().
func TestLoggerOutsideAStepIsTheWorkersPlainLogger(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	worker.Logger(worker.NewContext(context.Background(), &worker.Env{Logger: log})).Info("plain")
	rs := logs.Records(t)
	if len(rs) != 1 || rs[0]["msg"] != "plain" || len(rs[0]) != 3 {
		t.Errorf("records %v; want one with only time, level and msg", rs)
	}
	if worker.Logger(context.Background()) != slog.Default() {
		t.Error("Logger outside a worker is not slog.Default()")
	}
}

// asynq formats only what the worker's logger keeps: its LogLevel is the
// lowest level the logger's handler enables.
func TestAsynqLogsAtTheLevelTheWorkersLoggerEnables(t *testing.T) {
	t.Parallel()
	for lv, want := range map[slog.Level]asynq.LogLevel{
		slog.LevelDebug: asynq.DebugLevel, slog.LevelInfo: asynq.InfoLevel,
		slog.LevelWarn: asynq.WarnLevel, slog.LevelError: asynq.ErrorLevel, slog.LevelError + 4: asynq.ErrorLevel,
	} {
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
		if got := worker.AsynqLevel(log); got != want {
			t.Errorf("logger at %v: asynq at %v, want %v", lv, got, want)
		}
	}
}

// --log-level warn keeps a worker's stderr to what needs a look: no info
// or debug record of its own or asynq's. --log-level debug lets asynq's
// debug records through, with component=asynq, in JSON with --log-format.
func TestLogLevelFlagSetsWhatTheWorkerAndAsynqLog(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	testenv.JobQueue(t, rdb, prefix, "squares")
	bin := testenv.Build(t, "./testdata/squares")
	env := append(os.Environ(), "REDIS_URL="+testenv.RedisURL(t), "BATCHMR_PREFIX="+prefix)
	mr := mustClient(t, rdb, prefix)
	args := []string{"--permits", "cpu=2", "--poll-interval", "20ms", "--log-format", "json"}
	quiet := startProc(t, bin, env, append(args, "--log-level", "warn")...)
	chatty := startProc(t, bin, append(env, "LOG_LEVEL=warn"), append(args, "--log-level", "debug")...)
	waitAnnounced(t, mr, "squares", 2)
	testenv.WaitFor(t, 10*time.Second, "asynq's debug records at --log-level debug", func() bool {
		return strings.Contains(chatty.output(), `"level":"DEBUG"`) && strings.Contains(chatty.output(), `"component":"asynq"`)
	})
	for _, p := range []*proc{quiet, chatty} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		// Process.Wait, unlike Cmd.Wait, leaves stderr open to be read to
		// its end: the shutdown's records too.
		if st, err := p.cmd.Process.Wait(); err != nil || !st.Success() {
			t.Errorf("worker after SIGTERM: %v, %v; want exit 0", st, err)
		}
		<-p.eof
	}
	var asynqDebug, started bool
	for _, r := range testenv.Records(t, []byte(chatty.output())) {
		asynqDebug = asynqDebug || r["component"] == "asynq" && r["level"] == "DEBUG"
		started = started || r["msg"] == "worker: started" && r["level"] == "INFO"
	}
	if !asynqDebug || !started {
		t.Errorf("--log-level debug (over LOG_LEVEL=warn): asynq debug %v, worker info %v; want both:\n%s", asynqDebug, started, chatty.output())
	}
	for _, r := range testenv.Records(t, []byte(quiet.output())) {
		if r["level"] == "INFO" || r["level"] == "DEBUG" {
			t.Errorf("--log-level warn logged %v", r)
		}
	}
}

// A job that queries the worker's pool past the semaphore takes the fleet
// over its permits, and nothing else would show it: the worker warns, with
// the page's run and the count, at most once a minute; queries under a
// permit (pgsource) are not warned of.
func TestAQueryWithoutAPermitOnTheWorkersPoolIsWarnedOf(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	const name = "unguarded"
	testenv.JobQueue(t, rdb, prefix, name)
	job := pagesJob(name, func(ctx context.Context, p int) (int, error) {
		db, sem, err := worker.Database(ctx)
		if err != nil {
			return 0, err
		}
		// Guarded: no warning.
		if _, err := pgsource.Fetch(ctx, db, sem, "SELECT $1::int + $2::int", pgsource.KeyRange{Lo: 1, Hi: 2}, pgx.RowTo[int32]); err != nil {
			return 0, err
		}
		if p%2 == 0 {
			return p, nil
		}
		var n int
		err = db.QueryRow(ctx, "SELECT 'unguarded'::text, $1::int", p).Scan(new(string), &n)
		return n, err
	}, mapreduce.JobOptions{Backoff: func(int, error) time.Duration { return 10 * time.Millisecond }})
	var logs testenv.LogBuffer
	id := runToSuccess(t, worker.Config{RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t), Prefix: prefix,
		Concurrency: 2, PollInterval: 20 * time.Millisecond, Permits: map[string]int{"db": 2},
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, job, 6)
	var warnings []map[string]any
	for _, r := range logs.Records(t) {
		if msg, _ := r["msg"].(string); strings.Contains(msg, "without a permit") {
			warnings = append(warnings, r)
		}
	}
	// Three pages query unguarded; the first is warned of, the others
	// counted towards the next warning, a minute later.
	if len(warnings) != 1 {
		t.Fatalf("%d warnings of queries without a permit, want 1: %v", len(warnings), warnings)
	}
	w := warnings[0]
	if msg := w["msg"].(string); !strings.Contains(msg, `semaphore "db"`) || !strings.Contains(msg, "pgsource.Do") ||
		w["run"] != id || w["job"] != name || w["step"] != "map" || !strings.Contains(w["sql"].(string), "'unguarded'") || w["queries_without_a_permit"] != 1.0 {
		t.Errorf("the warning %v: want the semaphore, the fix, the page's run, job and step, the query and a count of 1", w)
	}
}

// pagesJob is a job whose Split emits pages 0..n-1 for n, each mapped by
// mapf, and whose Reduce sums their results.
func pagesJob(name string, mapf func(ctx context.Context, p int) (int, error), o mapreduce.JobOptions) mapreduce.Job[int, int, int, int] {
	return mapreduce.Job[int, int, int, int]{
		Name: name,
		Split: func(ctx context.Context, n int, emit func(int) error) error {
			for i := range n {
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		},
		Map: mapf,
		Reduce: func(ctx context.Context, _ int, pages iter.Seq2[mapreduce.PageResult[int, int], error]) (int, error) {
			sum := 0
			for p, err := range pages {
				if err != nil {
					return 0, err
				}
				sum += p.Result
			}
			return sum, nil
		},
		Options: o,
	}
}

// runToSuccess runs a worker of cfg with job, starts a run of job with
// args, waits for it to succeed and stops the worker; it returns the run.
func runToSuccess(t *testing.T, cfg worker.Config, job mapreduce.Job[int, int, int, int], args int) string {
	t.Helper()
	ctx := context.Background()
	wctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(wctx, cfg, job) }()
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	mr := mustClient(t, rdb, cfg.Prefix)
	id, err := job.Start(ctx, mr, args, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if st, err := mr.Wait(wait, id); err != nil || st.State != mapreduce.StateSucceeded {
		t.Fatalf("run %s: %+v, %v; want succeeded", id, st, err)
	}
	stop()
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	return id
}
