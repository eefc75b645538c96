package semaphore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	return s.run(ctx, sc, argv)
}

// How a Semaphore runs its scripts.
const (
	modeFunctions int32 = iota // FCALL, loading the library when missing
	modeEval                   // EVALSHA: the server has no functions, or refused ours
)

// run runs sc as a function of this build's library, loading the library
// when the server lacks it (after a restart, a flush or a failover to an
// empty node), or as a script where functions are unavailable: Redis < 7,
// or an ACL that forbids FUNCTION LOAD.
func (s *Semaphore) run(ctx context.Context, sc *script, argv []any) (any, error) {
	if s.scriptMode.Load() == modeFunctions {
		res, err := s.rdb.FCall(ctx, sc.function, s.keys, argv...).Result()
		switch {
		case isNoPermission(err):
			s.useEval("the server's ACL forbids FCALL", err)
			return sc.eval.Run(ctx, s.rdb, s.keys, argv...).Result()
		case !isMissingFunction(err):
			return res, err
		}
		if err := s.loadLibrary(ctx, err); err != nil {
			return nil, err
		}
		if s.scriptMode.Load() == modeFunctions {
			res, err = s.rdb.FCall(ctx, sc.function, s.keys, argv...).Result()
			if !isMissingFunction(err) {
				return res, err
			}
			// Loaded, yet still missing: the load reached another node than
			// the call (a client that routes FUNCTION LOAD at random).
			s.useEval("the library was loaded but calls still do not find it", err)
		}
	}
	return sc.eval.Run(ctx, s.rdb, s.keys, argv...).Result()
}

func isNoPermission(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOPERM")
}

// isMissingFunction reports whether err says the server has no such
// function, or no functions at all.
func isMissingFunction(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "function not found") || strings.Contains(msg, "unknown command")
}

// loadLibrary loads this build's function library on the node that holds
// the semaphore's keys, or switches to scripts if the server cannot have it.
// It returns only errors worth retrying: the server being unreachable.
func (s *Semaphore) loadLibrary(ctx context.Context, callErr error) error {
	if strings.Contains(strings.ToLower(callErr.Error()), "unknown command") {
		s.useEval("the server has no FCALL (Redis < 7)", callErr)
		return nil
	}
	var node redis.Cmdable = s.rdb
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		m, err := c.MasterForKey(ctx, s.keys[0])
		if err != nil {
			return err
		}
		node = m
	}
	err := node.FunctionLoadReplace(ctx, libraryCode).Err()
	var rerr redis.Error
	if errors.As(err, &rerr) {
		s.useEval("the server refused to load the function library", err)
		return nil
	}
	return err
}

func (s *Semaphore) useEval(why string, err error) {
	if s.scriptMode.Swap(modeEval) != modeEval {
		s.log.Info("semaphore: running scripts with EVALSHA instead of functions: "+why, "error", err)
	}
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
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
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

// releaseToken gives back whatever token holds or waits for in Redis, and
// hands the capacity it frees to this process's own waiters directly when
// they are next in line: no wake-up round trip for a local hand-off. Should
// the reply be lost, the watchdog finds those grants at its next refresh.
func (s *Semaphore) releaseToken(ctx context.Context, token string) (int64, error) {
	res, err := s.evalAs(ctx, s.process, scriptRelease, token)
	if err != nil {
		return 0, err
	}
	vals, _ := res.([]any)
	if len(vals) == 0 || len(vals)%2 != 1 {
		return 0, fmt.Errorf("unexpected reply %v from the release script", res)
	}
	for i := 1; i+1 < len(vals); i += 2 {
		tok, _ := vals[i].(string)
		fence, _ := vals[i+1].(int64)
		s.deliver(tok, fence, time.Time{})
	}
	if len(vals) > 1 {
		// Let the new holder run now, on this thread, rather than after our
		// caller's next Redis call or once an idle thread wakes up.
		runtime.Gosched()
	}
	was, _ := vals[0].(int64)
	return was, nil
}

// releaseDetached gives token back for a caller that has already moved on.
func (s *Semaphore) releaseDetached(token string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := s.releaseToken(ctx, token); err != nil {
		s.log.Warn("semaphore: could not give back an abandoned request; it returns when its lease runs out", "token", token, "error", err)
	}
}

// spawn runs fn in a goroutine that Close waits for.
func (s *Semaphore) spawn(fn func()) {
	s.mu.Lock()
	tracked := !s.detachedDone
	if tracked {
		s.detached.Add(1)
	}
	s.mu.Unlock()
	go func() {
		if tracked {
			defer s.detached.Done()
		}
		fn()
	}()
}
