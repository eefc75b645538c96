package semaphore

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
	"github.com/redis/go-redis/v9"
)

// dispatchBlock is how long one pop of the wake list waits. Grants end it
// at once and Close pushes a message to end it; the timeout only bounds how
// long a dispatcher can miss a stop when Redis could not take Close's
// message.
const dispatchBlock = 5 * time.Second

// dispatch is the one goroutine per Semaphore that waits on this process's
// wake list and routes each grant to its local waiter. However many
// goroutines wait, the process blocks on one Redis connection.
//
// On a *redis.Client that connection is one of the dispatcher's own
// (Client.Conn), so that a dropped connection — Redis killed, restarted,
// cut off — is an error the dispatcher sees: on a pooled connection go-redis
// would redial and send the pop again unseen, and a Redis that restarted
// empty, without this process's waiters, would go unnoticed until the next
// refresh. Seeing it, the dispatcher tells the watchdog, which refreshes as
// soon as Redis answers (see noteCall). Other clients (Cluster, Ring) block
// on a pooled connection, and such a restart is found by the next refresh
// or by any other call that fails meanwhile.
func (s *Semaphore) dispatch() {
	defer s.wg.Done()
	var conn *redis.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	var bo backoff.Backoff
	blpopOnly := false
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		var cmd redis.Cmdable = s.rdb
		if c, ok := s.rdb.(*redis.Client); ok {
			if conn == nil {
				conn = ownConn(c)
			}
			cmd = conn
		}
		msgs, err := s.popWakeups(cmd, &blpopOnly)
		if err != nil && !errors.Is(err, redis.Nil) && conn != nil {
			_ = conn.Close() // a connection that failed is not used again
			conn = nil
		}
		if errors.Is(err, redis.ErrClosed) {
			s.log.Warn("semaphore: the redis client was closed before the semaphore; waiters here will not be woken: call Semaphore.Close first")
			return
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			if !s.retryPop(err, &bo) {
				return
			}
			continue
		}
		s.noteCall(nil, true)
		bo.Reset()
		if err != nil {
			continue // redis.Nil: the block timed out
		}
		acked := s.ackPopped(conn, msgs)
		if s.route(msgs, acked) {
			runtime.Gosched() // the new holders run before our next pop is sent
		}
	}
}

// retryPop logs a failed pop of the wake list and waits out the backoff
// before the next. It returns false when the Semaphore is stopping.
//
// A grant pushed while we cannot read it is not lost: it stays on the list
// (unless Redis restarts without it), and the refresh that follows Redis's
// return reports it too.
func (s *Semaphore) retryPop(err error, bo *backoff.Backoff) bool {
	s.noteCall(err, true)
	wait := bo.Next()
	level := slog.LevelWarn
	if transient(err) {
		level = slog.LevelDebug // noteCall said it once for the outage
	}
	s.log.Log(context.Background(), level, "semaphore: waiting for wake-ups failed, retrying", "error", err, "retry_in", wait)
	return s.pause(context.Background(), wait) == nil
}

// ackPopped returns the replica count to deliver the grants in msgs with:
// grantReplicated when none need wait, else the replicas a WAIT counted,
// grantUnconfirmed if it failed. A grant popped here was made by another
// connection's script: a write of ours after the pop, and a WAIT for it,
// cover it. conn is the dispatcher's own connection, or nil when it blocks
// on a pooled one.
func (s *Semaphore) ackPopped(conn *redis.Conn, msgs []string) int {
	acked := grantReplicated
	if s.unconfirmed() != grantReplicated && len(msgs) > 0 {
		ctx, cancel := bounded(context.Background(), releaseTimeout)
		var n int
		var err error
		if conn != nil {
			n, err = s.syncReplicaOn(ctx, conn, s.waitBound)
		} else {
			n, err = s.syncReplica(ctx, s.waitBound)
		}
		cancel()
		acked = n
		if err != nil {
			acked = grantUnconfirmed
		}
	}
	return acked
}

// route hands each popped wake-up to its local waiter: a grant (with the
// replica count acked) or a rejection. It reports whether it delivered a
// grant.
func (s *Semaphore) route(msgs []string, acked int) bool {
	delivered := false
	for _, msg := range msgs {
		token, value, ok := strings.Cut(msg, " ")
		if !ok {
			continue // Close's wake-up: the loop head sees stop.
		}
		if value == "!" {
			s.reject(token)
			continue
		}
		fence, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			s.log.Warn("semaphore: malformed wake-up ignored", "message", msg)
			continue
		}
		s.deliver(token, fence, time.Time{}, acked)
		delivered = true
	}
	return delivered
}

// wakeBatch is how many wake-ups one pop takes at most. Grants to one
// process come in bursts when many permits turn over at once (a raised
// limit, short holds on a large limit); one BLPOP each made the last of a
// burst wait a round trip per grant ahead of it, and cost Redis a command
// per grant.
const wakeBatch = 64

// popWakeups waits for the next wake-ups on this process's list and takes
// all that are there, up to wakeBatch, with BLMPOP (Redis 7). Where the
// server has no BLMPOP (Redis 6: unknown command) or the ACL forbids it
// (NOPERM), it pops one at a time with BLPOP, for good: *blpopOnly
// remembers. redis.Nil means the block timed out.
func (s *Semaphore) popWakeups(cmd redis.Cmdable, blpopOnly *bool) ([]string, error) {
	ctx := context.Background()
	if !*blpopOnly {
		_, msgs, err := cmd.BLMPop(ctx, dispatchBlock, "left", wakeBatch, s.wakeKey).Result()
		// NOPERM for the command itself; one for the key would refuse
		// BLPOP as well, and is returned.
		refused := isNoPermission(err) && strings.Contains(strings.ToLower(err.Error()), "blmpop")
		if !isUnknownCommand(err) && !refused {
			return msgs, err
		}
		*blpopOnly = true
		s.log.Info("semaphore: BLMPOP is unavailable (Redis < 7, or the ACL forbids it); waiting for wake-ups with BLPOP, one per round trip", "error", err)
	}
	res, err := cmd.BLPop(ctx, dispatchBlock, s.wakeKey).Result()
	if err != nil {
		return nil, err
	}
	return res[1:], nil
}

// ownConn takes a dedicated connection from c for the dispatcher, with the
// client's hooks and timeouts but options of its own.
//
// c.Conn() alone would share c's *Options under a second lock: go-redis
// (v9.23) writes the maintenance-notifications mode back into the options
// when a server refuses the handshake (Redis before 8, in the default "auto"
// mode), each client and each Conn under its own lock, so the dispatcher's
// dial raced with the client's first dials (a data race, not a wrong
// result). WithTimeout copies the options under c's lock; the Conn taken
// from that copy writes only to the copy. The copy shares c's pool and is
// never closed: closing it would close c's pool.
func ownConn(c *redis.Client) *redis.Conn {
	return c.WithTimeout(c.Options().ReadTimeout).Conn()
}
