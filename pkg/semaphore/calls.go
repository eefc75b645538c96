package semaphore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// eval runs a script with the arguments every script shares (see
// scripts/lib.lua). Grants it makes are pushed to wake lists, ours included.
func (s *Semaphore) eval(ctx context.Context, sc *script, args ...any) (any, error) {
	return s.evalAs(ctx, "", sc, args...)
}

// evalAs is eval for a script that returns the grants it makes to process
// self's waiters instead of pushing them to self's wake list.
func (s *Semaphore) evalAs(ctx context.Context, self string, sc *script, args ...any) (any, error) {
	argv := make([]any, 0, 4+len(args))
	argv = append(argv, s.wakePrefix, s.opts.Limit, (2 * s.opts.Lease).Milliseconds(), self)
	argv = append(argv, args...)
	res, err := s.run(ctx, sc, argv)
	err = ownTimeout(ctx, err)
	s.noteCall(err, sc != scriptRefresh)
	return res, err
}

// How a Semaphore runs its scripts.
const (
	modeFunctions int32 = iota // FCALL, loading the library when missing
	modeEval                   // EVALSHA for good: the server has no functions, or its ACL forbids ours
)

// functionsPause is how long a handle runs EVALSHA after the library could
// not be loaded or found for a reason that may pass (a failover, a busy or
// full server), before it tries functions again.
const functionsPause = 10 * time.Second

// run runs sc as a function of the handle's library, loading the library
// when the server lacks it (a restart without persistence, FUNCTION FLUSH,
// a slot moved to a node that never had it). It runs the same Lua with
// EVALSHA instead, for good where functions are unavailable (Redis < 7, an
// ACL that forbids FCALL or FUNCTION LOAD), and for a while when they fail
// for a reason that may pass.
func (s *Semaphore) run(ctx context.Context, sc *script, argv []any) (any, error) {
	once := sentOnce(sc, argv)
	if s.scriptMode.Load() == modeEval || time.Now().UnixNano() < s.functionsAfter.Load() {
		return s.evalScript(ctx, sc, argv, once)
	}
	fn := s.lib.functions[sc]
	res, err := s.call(ctx, once, "fcall", fn, argv)
	switch {
	case err == nil:
		return res, nil
	case isUnknownCommand(err):
		s.useEval("the server has no FCALL (Redis < 7)", err)
	case isNoPermission(err):
		s.useEval("the server's ACL forbids FCALL", err)
	case isOOM(err):
		// Over maxmemory Redis refuses a function not flagged allow-oom
		// outright, but runs a script until its first write that may grow
		// memory: an acquire that finds the semaphore full, or purges or
		// grants before it queues, still works that way.
	case !isFunctionNotFound(err):
		return nil, err
	default:
		if err := s.loadLibrary(ctx); err != nil {
			if !isServerError(err) {
				return nil, err // unreachable: the caller retries or gives up
			}
			s.pauseFunctions("the function library could not be loaded", err)
			break
		}
		res, err = s.call(ctx, once, "fcall", fn, argv)
		if !isFunctionNotFound(err) {
			return res, err
		}
		// Loaded, yet still missing: the call reached a node the load did
		// not (a cluster whose slot map is being refreshed).
		s.pauseFunctions("the function library was loaded but the call did not find it", err)
	}
	return s.evalScript(ctx, sc, argv, once)
}

// sentOnce reports whether a call of sc with argv must reach Redis at most
// once: a call that takes a place or a permit for a token that Redis has
// no record of, an acquire's first attempt or a release that carries
// waiters. go-redis resends a command whose reply did not come in time;
// both copies may land, and a copy that lands after the token was given up
// would take a place or permit that nobody uses. The semaphore retries such
// a call itself, as a retry (acquire.lua's ARGV[9]), which never takes a
// place for a token Redis does not know, and gives up a token that Redis
// did not know with a tombstone that the one copy finds if it lands late
// (bury, scripts/lib.lua).
func sentOnce(sc *script, argv []any) bool {
	switch sc {
	case scriptCarry:
		return true
	case scriptAcquire:
		return len(argv) > 8 && argv[8] == "0" // ARGV[9], the retry flag
	}
	return false
}

// evalScript runs sc with EVALSHA, and with EVAL if the server does not
// have it cached (which means it did not run), as redis.Script.Run does.
func (s *Semaphore) evalScript(ctx context.Context, sc *script, argv []any, once bool) (any, error) {
	res, err := s.call(ctx, once, "evalsha", sc.eval.Hash(), argv)
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		res, err = s.call(ctx, once, "eval", sc.src, argv)
	}
	return res, err
}

// call sends one script call (FCALL, EVALSHA or EVAL) of s's keys with
// argv, as go-redis's FCall and EvalSha do; with once, go-redis does not
// resend it when its reply is late or lost (onceCmd), and the caller
// decides what to do.
func (s *Semaphore) call(ctx context.Context, once bool, name, payload string, argv []any) (any, error) {
	args := make([]any, 0, 3+len(s.keys)+len(argv))
	args = append(args, name, payload, len(s.keys))
	for _, k := range s.keys {
		args = append(args, k)
	}
	args = append(args, argv...)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	var c redis.Cmder = cmd
	if once {
		c = onceCmd{cmd}
	}
	if a, _ := ctx.Value(replicaAckKey{}).(*replicaAck); a != nil {
		n, _ := s.callSynced(ctx, c, s.waitBound) // cmd's own error is in cmd
		a.n.Store(int64(n))
		return cmd.Result()
	}
	_ = s.rdb.Process(ctx, c)
	return cmd.Result()
}

// onceCmd is a command that go-redis sends at most once: after it was
// written, a timeout or a dropped connection is returned to the caller,
// not retried (go-redis v9's Cmder.NoRetry).
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

func isServerError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, redis.ErrClosed)
}

func isNoPermission(err error) bool {
	return isServerError(err) && strings.HasPrefix(err.Error(), "NOPERM")
}

func isOOM(err error) bool {
	if !isServerError(err) {
		return false
	}
	// Redis 7 passes a script's OOM refusal on as it is; Redis 6 wraps it:
	// "ERR Error running script (call to f_…): @user_script:N: -OOM command
	// not allowed when used memory > 'maxmemory'".
	msg := err.Error()
	return strings.HasPrefix(msg, "OOM") || strings.Contains(msg, "OOM command not allowed")
}

func isUnknownCommand(err error) bool {
	if !isServerError(err) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}

func isFunctionNotFound(err error) bool {
	return isServerError(err) && strings.Contains(strings.ToLower(err.Error()), "function not found")
}

// loadLibrary loads the handle's function library wherever its calls may
// go: every master of a cluster, every shard of a ring, or the one server.
// A server that can never have it (no FUNCTION command, an ACL that forbids
// loading) switches the handle to EVALSHA for good.
func (s *Semaphore) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		return c.FunctionLoadReplace(ctx, s.lib.code).Err()
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, load)
	case *redis.Ring:
		err = c.ForEachShard(ctx, load)
	default:
		err = s.rdb.FunctionLoadReplace(ctx, s.lib.code).Err()
	}
	if isUnknownCommand(err) || isNoPermission(err) {
		s.useEval("the server cannot load the function library", err)
		return nil
	}
	return err
}

func (s *Semaphore) useEval(why string, err error) {
	if s.scriptMode.Swap(modeEval) != modeEval {
		s.log.Info("semaphore: running scripts with EVALSHA instead of functions: "+why, "error", err)
	}
}

func (s *Semaphore) pauseFunctions(why string, err error) {
	s.functionsAfter.Store(time.Now().Add(functionsPause).UnixNano())
	s.log.Warn("semaphore: running scripts with EVALSHA for a while: "+why, "retry_in", functionsPause, "error", err)
}

// evalUntil runs a script for token but returns as soon as ctx is done or
// the Semaphore is closed, even if the client would wait longer (go-redis
// applies its own read timeout, not ctx's, unless the client sets
// ContextTimeoutEnabled). If it returns early and token is not empty,
// whatever the late call did for token is undone when it returns.
func (s *Semaphore) evalUntil(ctx context.Context, token string, sc *script, args ...any) (any, error) {
	if ctx.Done() == nil {
		return s.eval(ctx, sc, args...)
	}
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	s.spawn(func() {
		// Detached from ctx, so that the reply tells what Redis did; bounded,
		// so that Close never waits on it for long.
		cctx, cancel := bounded(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		v, err := s.eval(cctx, sc, args...)
		done <- result{v, err}
	})
	var err error
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		err = fmt.Errorf("%w (no reply from Redis before the deadline)", ctx.Err())
	case <-s.stop:
		err = ErrClosed
	}
	s.spawn(func() {
		r := <-done
		if r.err != nil {
			level := slog.LevelWarn
			if transient(r.err) {
				level = slog.LevelDebug // the handle's outage log warned of the outage once
			}
			s.log.Log(context.Background(), level, "semaphore: a Redis call abandoned by its caller failed", "error", r.err)
		}
		if token != "" {
			s.releaseDetached(token)
		}
	})
	return nil, err
}

// spawn runs fn in a goroutine that Close waits for.
func (s *Semaphore) spawn(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spawnLocked(fn)
}

// spawnLocked is spawn with s.mu held.
func (s *Semaphore) spawnLocked(fn func()) {
	tracked := !s.detachedDone
	if tracked {
		s.detached.Add(1)
	}
	go func() {
		if tracked {
			defer s.detached.Done()
		}
		fn()
	}()
}
