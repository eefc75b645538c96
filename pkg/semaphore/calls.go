package semaphore

import (
	"context"
	"errors"
	"fmt"
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
	if s.scriptMode.Load() == modeEval || time.Now().UnixNano() < s.functionsAfter.Load() {
		return sc.eval.Run(ctx, s.rdb, s.keys, argv...).Result()
	}
	fn := s.lib.functions[sc]
	res, err := s.rdb.FCall(ctx, fn, s.keys, argv...).Result()
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
		res, err = s.rdb.FCall(ctx, fn, s.keys, argv...).Result()
		if !isFunctionNotFound(err) {
			return res, err
		}
		// Loaded, yet still missing: the call reached a node the load did
		// not (a cluster whose slot map is being refreshed).
		s.pauseFunctions("the function library was loaded but the call did not find it", err)
	}
	return sc.eval.Run(ctx, s.rdb, s.keys, argv...).Result()
}

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
			s.log.Warn("semaphore: a Redis call abandoned by its caller failed", "error", r.err)
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
