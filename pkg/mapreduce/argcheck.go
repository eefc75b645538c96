package mapreduce

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/redis/go-redis/v9"
)

// A job's arguments given as JSON (StartJSON, CheckJSON) are checked by a
// process that runs the job: this one, or a live worker asked through the
// catalogue. The asker pushes a request on the job's check list and waits
// on the request's own answer list; every worker that announces the job
// waits on the check lists of its jobs (answerChecks).

// checkJSON finds a job, here or in the catalogue, and checks args for it:
// here if this process runs it, else by a live worker that does. It
// returns the job's spec and the arguments compacted.
func (cat *catalog) checkJSON(ctx context.Context, job string, args json.RawMessage) (jobSpec, []byte, error) {
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	if r, ok := cat.jobs.lookup(job); ok {
		if r.options().Codec != JSON {
			return jobSpec{}, nil, errNotJSON
		}
		args = compactJSON(args)
		if err := checkArgsSize(r.options(), len(args)); err != nil {
			return jobSpec{}, nil, err
		}
		if err := r.checkArgs(args); err != nil {
			return jobSpec{}, nil, err
		}
		return specUnder(cat.prefix, job, r.options()), args, nil
	}
	info, err := cat.job(ctx, job)
	if err != nil {
		return jobSpec{}, nil, err
	}
	if !info.JSON {
		return jobSpec{}, nil, errNotJSON
	}
	if !json.Valid(args) {
		return jobSpec{}, nil, fmt.Errorf("%w: %.200q is not JSON", ErrInvalidArgs, args)
	}
	spec := info.spec()
	args = compactJSON(args)
	if err := checkArgsSize(spec.o, len(args)); err != nil {
		return jobSpec{}, nil, err
	}
	if len(info.Workers) > 0 {
		if err := cat.askHost(ctx, job, args); err != nil {
			return jobSpec{}, nil, err
		}
	}
	return spec, args, nil
}

var errNotJSON = errors.New("the job's codec is not JSON: start it from Go with Job.Start")

// compactJSON drops the insignificant spaces of valid JSON: the arguments
// are stored with the run.
func compactJSON(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// checkTimeout bounds how long StartJSON waits for a host to check the
// arguments.
const checkTimeout = 5 * time.Second

type checkRequest struct {
	ID       string          `json:"id"`
	Args     json.RawMessage `json:"args"`
	Deadline int64           `json:"deadline"` // ms since the epoch, the caller's clock
}

type checkAnswer struct {
	Err string `json:"error,omitempty"`
}

// askHost asks a live host of job to check args: a request on the job's
// check list, one answer on the request's own list. A check nobody answers
// in time is withdrawn and passes: the split checks again.
func (cat *catalog) askHost(ctx context.Context, job string, args json.RawMessage) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	reqID := hex.EncodeToString(b[:])
	req, _ := json.Marshal(checkRequest{ID: reqID, Args: args, Deadline: time.Now().Add(checkTimeout).UnixMilli()})
	list := cat.key("check", job)
	if err := rediserr.Tx(cat.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, list, req)
		p.Expire(ctx, list, time.Minute)
		return nil
	})); err != nil {
		return err
	}
	res, err := cat.rdb.BRPop(ctx, checkTimeout, cat.key("answer", reqID)).Result()
	if err != nil {
		cat.rdb.LRem(context.WithoutCancel(ctx), list, 1, req)
		if errors.Is(err, redis.Nil) {
			cat.log.Warn("mapreduce: no worker checked the run's arguments in time; the split will", attrJob, job)
			return nil
		}
		return err
	}
	var ans checkAnswer
	if err := json.Unmarshal([]byte(res[1]), &ans); err != nil {
		return fmt.Errorf("a malformed answer to the argument check: %w", err)
	}
	if ans.Err != "" {
		return &remoteInvalid{ans.Err}
	}
	return nil
}

// remoteInvalid is a host's refusal of arguments: its message as the host
// wrote it (which names ErrInvalidArgs already), matching ErrInvalidArgs.
type remoteInvalid struct{ msg string }

func (e *remoteInvalid) Error() string        { return e.msg }
func (e *remoteInvalid) Is(target error) bool { return target == ErrInvalidArgs }

// answerChecks answers argument checks for the jobs this process runs until ctx is
// done, on one blocking connection.
func (cat *catalog) answerChecks(ctx context.Context) {
	names := cat.jobs.Names()
	lists := make([]string, len(names))
	for i, n := range names {
		lists[i] = cat.key("check", n)
	}
	for ctx.Err() == nil {
		res, err := cat.rdb.BRPop(ctx, 2*time.Second, lists...).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
				if !rediserr.Transient(err) {
					cat.log.Warn("mapreduce: waiting for argument checks failed", "error", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		job := strings.TrimPrefix(res[0], cat.key("check")+":")
		var req checkRequest
		if json.Unmarshal([]byte(res[1]), &req) != nil || req.ID == "" || time.Now().UnixMilli() > req.Deadline {
			continue // malformed, or its caller has given up
		}
		var ans checkAnswer
		if r, ok := cat.jobs.lookup(job); ok {
			if err := r.checkArgs(req.Args); err != nil {
				ans.Err = err.Error()
			}
		}
		b, _ := json.Marshal(ans)
		key := cat.key("answer", req.ID)
		_, _ = cat.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.LPush(ctx, key, b)
			p.Expire(ctx, key, time.Minute)
			return nil
		})
	}
}
