package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/internal/shorten"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ledger is the runs' record in Redis and what reads and writes it: the
// keys of a job's and a run's data, a run's creation, its pages' records
// and its end (by the scripts in scripts/, the synced ones through the
// job's batcher), the reads of a run's state, summaries, failures and
// stored results (summary.go, failures.go, reduceread.go), the claims its
// handlers leave, and its count of transient failures. Its reads and
// writes of a run's steps wait out a Redis outage (withRedis).
//
// It is not the run's state machine: it enqueues no task, runs no job's
// code, and neither logs what it changed nor tells an Observer; the
// Client's handlers and the repairer do, with what it returns.
type ledger struct {
	rdb       redis.UniversalClient
	prefix    string      // Config.Prefix
	batches   sync.Map    // job name → *batcher: handlers' page reads and records
	outages   *outage.Log // the Redis outages its reads and writes wait out
	readBytes int64       // reduceReadBytes; tests lower it
}

func newLedger(rdb redis.UniversalClient, prefix string, outages *outage.Log) *ledger {
	return &ledger{rdb: rdb, prefix: prefix, outages: outages, readBytes: reduceReadBytes}
}

// jobKeys are the Redis keys of one job.
type jobKeys struct {
	runs, active string
	unfinished   string // runs not ended (reconcile.go)
	records      string // what its runs' records are named after (run = records + run ID)
	job          string // the job's name: its keys' hash tag
}

// jobKeysUnder returns the keys of job under prefix.
func jobKeysUnder(prefix, job string) jobKeys {
	base := prefix + ":{" + job + "}"
	return jobKeys{
		runs: base + ":runs", active: base + ":active", unfinished: base + ":unfinished",
		records: base + ":run:", job: job,
	}
}

// runKeys are the Redis keys of one run and of its job.
type runKeys struct {
	run, recorded, results, failures string
	transient                        string // transient failures per step (transient.go)
	jobKeys
}

func (k runKeys) all() []string {
	return []string{k.run, k.recorded, k.results, k.failures, k.active, k.unfinished}
}

// A run's ID is "<job>:<key>", its key being StartOptions.Key: Start
// returns it and Status.ID holds it. In code it is runID (runIDs for
// several); task payloads carry it as Run.

// jobOf returns the job name a run ID starts with.
func jobOf(runID string) (string, bool) {
	job, _, ok := strings.Cut(runID, ":")
	return job, ok && jobNameRE.MatchString(job)
}

// keys returns the Redis keys of the run runID and of its job, or an error
// if runID is not a run ID.
func (l *ledger) keys(runID string) (runKeys, error) { return keysUnder(l.prefix, runID) }

// keysUnder is keys under prefix.
func keysUnder(prefix, runID string) (runKeys, error) {
	job, ok := jobOf(runID)
	if !ok {
		return runKeys{}, fmt.Errorf("%q is not a run ID: run IDs look like <job>:<key>, as Start returns them and scheduler runs lists them", runID)
	}
	// The kind comes before the run ID: IDs may contain ':', and a kind
	// after it could make one run's key another run's ("k:results").
	base := prefix + ":{" + job + "}"
	jk := jobKeysUnder(prefix, job)
	return runKeys{
		run: jk.records + runID, recorded: base + ":recorded:" + runID,
		results: base + ":results:" + runID, failures: base + ":failures:" + runID,
		transient: base + ":transient:" + runID,
		jobKeys:   jk,
	}, nil
}

// batch returns the batcher of job's calls. Each job has its own: a job's
// keys share one hash slot, so that on Redis Cluster a round trip goes to
// one node, and a slow or failing node holds up only the calls of the jobs
// it serves.
func (l *ledger) batch(job string) *batcher { return batcherIn(&l.batches, job, l.rdb) }

// created is what createRun did: status 1 if it created the run, 0 if the
// run exists (detail its state, nonce its nonce), -1 if another run of the
// job is active (detail names it). unreplicated is not nil for a run it
// created that no replica acknowledged in time.
type created struct {
	status        int64
	detail, nonce string
	unreplicated  error
}

// createRun runs the start script for the run runID of job j with encoded
// arguments and nonce, as a synced write (replicas.go): where the primary
// has a replica, it returns once one has the run, so that a failover
// cannot lose a run whose ID Start returned (a tick's run, which its
// scheduler does not start again). A run no replica acknowledged within
// replicaWait is kept all the same (unreplicated): it exists, and failing
// its Start would have the caller start it again into ErrRunExists.
func (l *ledger) createRun(ctx context.Context, runID string, j jobSpec, encoded []byte, nonce string) (created, error) {
	k, err := l.keys(runID)
	if err != nil {
		return created{}, err
	}
	overlap := "0"
	if j.o.AllowOverlap {
		overlap = "1"
	}
	keys := []string{k.run, k.runs, k.active, k.unfinished}
	args := []any{runID, j.name, encoded, overlap, j.o.Retention.Milliseconds(), j.o.Queue, nonce, bundlePages}
	var out created
	for again := true; ; again = false {
		var sha *redis.Cmd
		err := l.batch(k.job).doScriptAs(ctx, true, scriptStart, func(pl redis.Pipeliner) *redis.Cmd {
			sha = scriptStart.EvalSha(ctx, pl, keys, args...)
			return sha
		})
		if errors.Is(err, errNotReplicated) && sha != nil {
			if sha.Err() == nil {
				out.unreplicated, err = err, nil
			} else if again {
				// Nothing was written (NOSCRIPT: the script was not
				// loaded): once more, now that the batcher has stopped
				// waiting for a replica that does not answer.
				continue
			}
		}
		if err != nil {
			return created{}, err
		}
		res, err := sha.Slice()
		if err != nil {
			return created{}, err
		}
		out.status, _ = res[0].(int64)
		out.detail, _ = res[1].(string)
		out.nonce, _ = res[2].(string)
		return out, nil
	}
}

// finish runs finish.lua, waiting out a Redis outage while ctx lives;
// from restricts the state the run must be in, and a nonce other than ""
// the attempt (Retry draws a new nonce). msg is kept shortened to
// errorMax. ended reports whether this call ended the run; state is the
// run's state after it ("" if the run does not exist).
func (l *ledger) finish(ctx context.Context, runID, nonce string, to State, result []byte, msg string, from State) (ended bool, state State, err error) {
	k, err := l.keys(runID)
	if err != nil {
		return false, "", err
	}
	hasResult := "0"
	if result != nil {
		hasResult = "1"
	}
	msg = shorten.To(msg, errorMax)
	var res []any
	err = withRedis(ctx, l.outages, "ending a run", func(ctx context.Context) (err error) {
		res, err = l.batch(k.job).runScriptSynced(ctx, scriptFinish, k.all(), runID, string(to), string(result), msg, string(from), hasResult, nonce).Slice()
		return err
	})
	if err != nil {
		return false, "", err
	}
	n, _ := res[0].(int64)
	s, _ := res[1].(string)
	return n == 1, State(s), nil
}

// record runs record.lua for pages of a run. mapUS is how long Map took
// over the measured pages that succeeded, for the run's packing (pack.go).
// claim, if not empty, is the recording handler's mark (claimOf), which
// record deletes. It returns the run's state after the call;
// StateReducing means the caller must make sure the reduce is enqueued.
func (l *ledger) record(ctx context.Context, k runKeys, nonce string, pages []pageOutcome, mapUS int64, measured int, claim string) (State, error) {
	keys := []string{k.run, k.recorded, k.results, k.failures}
	if claim != "" {
		keys = append(keys, claim)
	}
	args := make([]any, 0, 3+3*len(pages))
	args = append(args, nonce, mapUS, measured)
	for _, p := range pages {
		flag := "0"
		if p.failed {
			flag = "1"
		}
		args = append(args, p.i, p.outcome, flag)
	}
	res, err := l.batch(k.job).runScriptSynced(ctx, scriptRecord, keys, args...).Slice()
	if err != nil {
		return "", err
	}
	st, _ := res[1].(string)
	return State(st), nil
}

// recordTotal records the total of a split whose n pages are all fed
// (splitdone.lua), waiting out a Redis outage while ctx lives. It returns
// the run's state after the call, or "nondeterministic" if an earlier
// attempt of the split recorded more pages.
func (l *ledger) recordTotal(ctx context.Context, k runKeys, n int, nonce string) (string, error) {
	var st string
	err := withRedis(ctx, l.outages, "recording the split's total", func(ctx context.Context) (err error) {
		st, err = l.batch(k.job).runScriptSynced(ctx, scriptSplitDone, []string{k.run, k.recorded}, n, nonce).Text()
		return err
	})
	return st, err
}

// expectPages records the n pages the run expects in all (ExpectPages;
// feed.lua), waiting out a Redis outage while ctx lives.
func (l *ledger) expectPages(ctx context.Context, k runKeys, nonce string, n int) error {
	return withRedis(ctx, l.outages, "recording the pages expected", func(ctx context.Context) error {
		return scriptFeed.Run(ctx, l.rdb, []string{k.run, k.recorded}, nonce, 0, 0, "", n).Err()
	})
}

// handOn names a new split task for a splitting run (feed.lua), one no
// split task of the run had, to start at page resume (or where the run's
// resume mark is, if further), and returns its step name for its task ID;
// errRunGone if the run is not splitting under nonce. It waits out a Redis
// outage while ctx lives.
func (l *ledger) handOn(ctx context.Context, k runKeys, nonce string, resume int) (step string, err error) {
	var v []any
	err = withRedis(ctx, l.outages, "handing the split on", func(ctx context.Context) (err error) {
		v, err = scriptFeed.Run(ctx, l.rdb, []string{k.run, k.recorded}, nonce, resume, 0, "1").Slice()
		return err
	})
	if err != nil {
		return "", err
	}
	if n, _ := v[0].(int64); n < 0 {
		return "", errRunGone
	}
	step, _ = v[2].(string)
	return step, nil
}

// recordedBits is part of a run's bitmap of recorded pages: its bytes from
// the one that holds page from.
type recordedBits struct {
	from int
	b    []byte
}

func (r recordedBits) has(i int) bool { return bitSet(r.b, i-r.from/8*8) }

// unrecorded returns those of pages that are not recorded.
func (r recordedBits) unrecorded(pages []fedPage) []fedPage {
	var out []fedPage
	for _, pg := range pages {
		if !r.has(pg.i) {
			out = append(out, pg)
		}
	}
	return out
}

// bitSet reads bit i of a Redis bitmap (most significant bit first).
func bitSet(bits []byte, i int) bool {
	return i/8 < len(bits) && bits[i/8]&(0x80>>(i%8)) != 0
}

// pageState reads, in one round trip, the state and nonce of a run and
// which of its pages first to last are recorded, waiting out a Redis
// outage while ctx lives. If job is not empty, the handler that reads, a
// handler of job, claims its task in the same round trip. A run that does
// not exist has state "" and nonce "".
func (l *ledger) pageState(ctx context.Context, k runKeys, first, last int, job string) (state State, nonce string, recorded recordedBits, err error) {
	var (
		fields *redis.SliceCmd
		bits   *redis.StringCmd
		mark   *redis.StatusCmd
	)
	err = withRedis(ctx, l.outages, "reading the run's state", func(ctx context.Context) error {
		if err := l.batch(k.job).do(ctx, func(pl redis.Pipeliner) {
			fields = pl.HMGet(ctx, k.run, "state", "nonce")
			bits = pl.GetRange(ctx, k.recorded, int64(first/8), int64(last/8))
			if job != "" {
				mark = l.claim(ctx, pl, job)
			}
		}); err != nil {
			return err
		}
		if mark != nil && mark.Err() != nil {
			return mark.Err()
		}
		if err := errors.Join(fields.Err(), bits.Err()); err != nil {
			return err
		}
		if len(fields.Val()) != 2 {
			return fmt.Errorf("HMGET of the run's state and nonce returned %d values", len(fields.Val()))
		}
		return nil
	})
	if err != nil {
		return "", "", recordedBits{}, err
	}
	st, _ := fields.Val()[0].(string)
	nonce, _ = fields.Val()[1].(string)
	return State(st), nonce, recordedBits{from: first, b: []byte(bits.Val())}, nil
}

// runRecord holds fields of a run's hash that a handler read: a field the
// hash lacks is missing from it.
type runRecord map[string]string

// readRun reads fields of the run's hash (keys k), with its state and
// nonce, in one round trip that claims the task of job that ctx runs
// (claim) and carries also's commands (if not nil; a key they read may not
// exist), waiting out a Redis outage while ctx lives. current reports
// whether the run is in state under nonce, the task's: if not, the run has
// moved on, ended or expired, or the task is of an earlier run under its
// ID, and its handler does nothing.
func (l *ledger) readRun(ctx context.Context, k runKeys, job, nonce string, state State, also func(context.Context, redis.Pipeliner), fields ...string) (rec runRecord, current bool, err error) {
	fields = append([]string{"state", "nonce"}, fields...)
	var vals *redis.SliceCmd
	err = withRedis(ctx, l.outages, "reading the run", func(ctx context.Context) error {
		_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			vals = p.HMGet(ctx, k.run, fields...)
			if also != nil {
				also(ctx, p)
			}
			l.claim(ctx, p, job)
			return nil
		})
		if errors.Is(err, redis.Nil) {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, false, err
	}
	rec = runRecord{}
	for i, v := range vals.Val() {
		if v, ok := v.(string); ok {
			rec[fields[i]] = v
		}
	}
	got, ok := rec["nonce"]
	return rec, State(rec["state"]) == state && ok && got == nonce, nil
}

// claim adds to pl the mark that the task ctx runs, of a run of job, has
// a handler, and returns its command (nil outside a handler). Handlers
// send it with their first read of the run, so it costs no round trip.
func (l *ledger) claim(ctx context.Context, pl redis.Pipeliner, job string) *redis.StatusCmd {
	if key := l.claimOf(ctx, job); key != "" {
		return pl.Set(ctx, key, "", orphanGrace)
	}
	return nil
}

// claimOf returns the key of the mark of the task ctx runs, or "" outside
// an asynq handler. Recording a page deletes it: the work is done.
func (l *ledger) claimOf(ctx context.Context, job string) string {
	taskID, ok := asynq.GetTaskID(ctx)
	if !ok {
		return ""
	}
	n, _ := asynq.GetRetryCount(ctx)
	return claimKey(l.prefix, job, taskID, n)
}

// countTransient counts one more transient failure of a run's step and
// returns the count. The count expires with the run's retention after the
// last failure.
func (l *ledger) countTransient(ctx context.Context, k runKeys, step string, o JobOptions) (int, error) {
	var n int64
	err := withRedis(ctx, l.outages, "counting a transient failure", func(ctx context.Context) error {
		pl := l.rdb.TxPipeline()
		incr := pl.HIncrBy(ctx, k.transient, step, 1)
		pl.PExpire(ctx, k.transient, o.Retention)
		if err := rediserr.Tx(pl.Exec(ctx)); err != nil {
			return err
		}
		n = incr.Val()
		return nil
	})
	return int(n), err
}

// stateOf reads a run's state and how many of its pages failed for good:
// "" and 0 for a run that does not exist.
func (l *ledger) stateOf(ctx context.Context, k runKeys) (state State, failed int, err error) {
	look, err := l.rdb.HMGet(ctx, k.run, "state", "failed").Result()
	if err != nil {
		return "", 0, err
	}
	st, _ := look[0].(string)
	n, _ := look[1].(string)
	return State(st), atoi(n), nil
}

// resume runs retry.lua: it takes a failed or cancelled run back to
// splitting under nonce, forgetting its failed pages. outcome is "" if it
// did, else "missing" (no such run), "state" (detail: the run's state) or
// "active" (detail: the job's active run, which allowOverlap lets be).
func (l *ledger) resume(ctx context.Context, k runKeys, runID string, allowOverlap bool, nonce string) (outcome, detail string, err error) {
	overlap := "0"
	if allowOverlap {
		overlap = "1"
	}
	res, err := scriptRetry.Run(ctx, l.rdb, []string{k.run, k.recorded, k.results, k.failures, k.active, k.transient, k.unfinished},
		runID, overlap, nonce).Slice()
	if err != nil {
		return "", "", err
	}
	outcome, _ = res[0].(string)
	detail, _ = res[1].(string)
	return outcome, detail, nil
}

// noteError notes msg as the LastError of the run runID, of its attempt
// under nonce, failed in step (lasterror.lua).
func (l *ledger) noteError(ctx context.Context, runID, nonce, step, msg string) error {
	k, err := l.keys(runID)
	if err != nil {
		return err
	}
	return scriptLastError.Run(ctx, l.rdb, []string{k.run}, step, msg, nonce).Err()
}

// exists reports whether the run runID exists.
func (l *ledger) exists(ctx context.Context, runID string) (bool, error) {
	k, err := l.keys(runID)
	if err != nil {
		return false, err
	}
	n, err := l.rdb.Exists(ctx, k.run).Result()
	return n != 0, err
}

// began returns when the run runID began: when Start created it or Retry
// last resumed it; zero if that cannot be read.
func (l *ledger) began(ctx context.Context, runID string) time.Time {
	var began time.Time
	k, err := l.keys(runID)
	if err != nil {
		return began
	}
	vals, err := l.rdb.HMGet(ctx, k.run, "created", "retried").Result()
	if err != nil {
		return began
	}
	for _, v := range vals {
		if s, ok := v.(string); ok {
			if t := msTime(s); t.After(began) {
				began = t
			}
		}
	}
	return began
}

// states reads the states of the runs runIDs in one round trip: gone[i]
// reports that runIDs[i] does not exist. A run whose state could not be
// read has state "" and is not gone.
func (l *ledger) states(ctx context.Context, runIDs []string) (states []State, gone []bool, err error) {
	cmds := make([]*redis.StringCmd, len(runIDs))
	_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, runID := range runIDs {
			k, _ := l.keys(runID)
			cmds[i] = p.HGet(ctx, k.run, "state")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, nil, err
	}
	states, gone = make([]State, len(runIDs)), make([]bool, len(runIDs))
	for i, cmd := range cmds {
		states[i], gone[i] = State(cmd.Val()), cmd.Err() == redis.Nil
	}
	return states, gone, nil
}
