package semaphore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/backoff"
	"github.com/redis/go-redis/v9"
)

// Grants through a failover.
//
// Redis replicates asynchronously: a grant recorded on the primary may be
// lost when the primary dies before a replica has it, and the promoted
// replica would grant the same permit again. So where the primary has
// replicas, a grant is handed to its caller only once WAIT says a replica
// has it, and SetLimit returns only then. Releases and refreshes do not
// wait: a lost release keeps a permit taken until its lease runs out, and a
// lost refresh leaves a lease at most Lease/3 older than it was.
//
// WAIT waits for the replication offset of its connection's last write, so
// it runs on the connection that ran the script: pipelined after it, in
// one round trip, on the server (or, in a cluster, the master of the
// semaphore's slot). A grant made by another process's script and popped
// by the dispatcher is covered by a write of our own (SET of the sync key)
// and a WAIT after it on one connection: Redis replicates in order, so a
// replica that has our write has the grant before it. (The pop alone does
// not do: a BLPOP served after it blocked leaves its connection's offset
// where it was.)
//
// Without replicas nothing of this is sent. Whether the primary has any
// is asked with WAIT 0 0 as the first command of a new connection, which
// counts every connected replica: such a connection has written nothing
// (INFO and ROLE need @dangerous in an ACL; WAIT does not). The answer is
// kept, and asked again in the background every replicaRecheck while none
// were found (a replica added later). A grant that no replica acknowledges
// within Options.ReplicaWait goes on with a warning, and the handle counts
// none until a check finds one again: docs/semaphore.md says why.

// replicaRecheck is how often a handle that found no replica asks again,
// in the background, when it makes a call.
const replicaRecheck = 10 * time.Second

// replicas is what a handle knows of its primary's replicas.
type replicas struct {
	n        atomic.Int64 // replicas last found; -1 before the first look
	mu       sync.Mutex
	checked  time.Time
	checking bool
	warned   atomic.Bool // said once that WAIT is unavailable
}

// syncKey is written before a WAIT that must cover writes of other
// connections; it expires by itself.
func (s *Semaphore) syncKey() string { return s.wakePrefix[:len(s.wakePrefix)-len("wake:")] + "sync" }

// replicated reports whether this handle's grants must wait for a
// replica: Options.ReplicaWait is not negative, the client is one whose
// connections reach one primary (a *redis.Client, standalone or Sentinel,
// or a *redis.ClusterClient), and that primary has replicas. The first
// call of a handle asks Redis; after that it answers from what the handle
// knows and, while no replica was found, asks again in the background
// every replicaRecheck.
func (s *Semaphore) replicated(ctx context.Context) bool {
	if s.opts.ReplicaWait < 0 || !s.canWait() {
		return false
	}
	n := s.replicas.n.Load()
	if n < 0 {
		n = int64(s.checkReplicas(ctx))
	} else if n == 0 {
		s.replicas.mu.Lock()
		stale := !s.replicas.checking && time.Since(s.replicas.checked) > replicaRecheck
		if stale {
			s.replicas.checking = true
		}
		s.replicas.mu.Unlock()
		if stale {
			s.spawn(func() {
				cctx, cancel := bounded(context.Background(), releaseTimeout)
				defer cancel()
				s.checkReplicas(cctx)
			})
		}
	}
	return n > 0
}

// readTimeout is rdb's ReadTimeout, where it has one that bounds a WAIT.
func readTimeout(rdb redis.UniversalClient) time.Duration {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

func (s *Semaphore) canWait() bool {
	switch s.rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
		return true
	}
	return false
}

// checkReplicas asks the primary how many replicas it has (WAIT 0 0 on a
// new connection) and keeps the answer. A primary that refuses to answer
// (an ACL without WAIT) counts as having none; a failure that may pass
// leaves what the handle knew, so that a handle that knew nothing asks
// again at its next call, and counts as none meanwhile.
func (s *Semaphore) checkReplicas(ctx context.Context) int {
	n, err := s.countReplicas(ctx)
	s.replicas.mu.Lock()
	defer s.replicas.mu.Unlock()
	s.replicas.checking = false
	s.replicas.checked = time.Now()
	if err != nil {
		if isServerError(err) && !transient(err) {
			if !s.replicas.warned.Swap(true) {
				s.log.Warn("semaphore: cannot ask Redis for its replicas (WAIT); grants will not wait for a replica, and a failover may lose the last ones", "error", err)
			}
			s.replicas.n.Store(0)
		}
		return int(max(s.replicas.n.Load(), 0))
	}
	if old := s.replicas.n.Swap(int64(n)); old >= 0 && (old == 0) != (n == 0) {
		s.log.Info("semaphore: the Redis primary's replicas changed; grants wait for one when there are any", "replicas", n)
	}
	return n
}

func (s *Semaphore) countReplicas(ctx context.Context) (int, error) {
	node, err := s.primary(ctx)
	if err != nil {
		return 0, err
	}
	opt := *node.WithTimeout(node.Options().ReadTimeout).Options() // copied under the client's lock: see ownConn
	if opt.Password == "" && opt.Username == "" && opt.CredentialsProvider == nil &&
		opt.CredentialsProviderContext == nil && opt.StreamingCredentialsProvider == nil {
		return firstWait(ctx, &opt)
	}
	// go-redis authenticates first, and every command moves the
	// connection's offset to the primary's. WAIT 0 0 then counts the
	// replicas that have acknowledged the primary's last write: those in
	// sync, less any whose acknowledgement is on its way (a replica
	// acknowledges once a second unless asked). If it finds none, WAIT 1
	// asks them, for a moment: a connected replica answers at once.
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns = 1, 0, 0
	c := redis.NewClient(&opt)
	defer c.Close()
	n, err := c.Do(ctx, "wait", 0, 0).Int()
	if err != nil || n > 0 {
		return n, err
	}
	return c.Do(ctx, "wait", 1, max(min(s.waitBound, replicaProbe), time.Millisecond).Milliseconds()).Int()
}

// replicaProbe bounds the WAIT that asks a primary, over an authenticated
// connection, whether a replica is connected.
const replicaProbe = 100 * time.Millisecond

// firstWait sends WAIT 0 0 as the first command of a new connection made
// with opt's dialer, before go-redis's handshake: a connection that has
// sent nothing else waits for no offset, so the reply counts every
// replica connected to the primary.
func firstWait(ctx context.Context, opt *redis.Options) (int, error) {
	conn, err := opt.Dialer(ctx, opt.Network, opt.Addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	if _, err := conn.Write([]byte("*3\r\n$4\r\nWAIT\r\n$1\r\n0\r\n$1\r\n0\r\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, ":"):
		return strconv.Atoi(line[1:])
	case strings.HasPrefix(line, "-"):
		return 0, replyError(line[1:])
	}
	return 0, fmt.Errorf("unexpected reply %q to WAIT", line)
}

// primary returns a client of the server that runs the semaphore's
// scripts: the client itself, or the master of the semaphore's slot.
func (s *Semaphore) primary(ctx context.Context) (*redis.Client, error) {
	switch c := s.rdb.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, s.keys[0])
	}
	return nil, errors.New("this redis client cannot send WAIT to the semaphore's server")
}

// callSynced sends cmd and, pipelined after it on the same connection,
// WAIT 1 bound. It returns how many replicas acknowledged
// cmd's writes; 0 with a nil error means none within the bound, or that
// cmd could not go this way (a cluster slot that moved), and then it was
// sent the ordinary way. The pipeline keeps cmd's NoRetry: go-redis does
// not resend a pipeline that holds one.
func (s *Semaphore) callSynced(ctx context.Context, cmd redis.Cmder, bound time.Duration) (int, error) {
	node, err := s.primary(ctx)
	if err != nil {
		return 0, s.rdb.Process(ctx, cmd)
	}
	pipe := node.Pipeline()
	_ = pipe.Process(ctx, cmd)
	wait := redis.NewIntCmd(ctx, "wait", 1, bound.Milliseconds())
	_ = pipe.Process(ctx, wait)
	_, _ = pipe.Exec(ctx)
	if err := cmd.Err(); err != nil {
		if _, ok := s.rdb.(*redis.ClusterClient); ok && isRedirect(err) {
			// Not run there: the slot moved. Send it the way that follows
			// the move; the caller makes sure of a replica afterwards.
			return 0, s.rdb.Process(ctx, cmd)
		}
		return 0, err
	}
	return int(wait.Val()), nil
}

func isRedirect(err error) bool {
	return isServerError(err) && (strings.HasPrefix(err.Error(), "MOVED ") || strings.HasPrefix(err.Error(), "ASK "))
}

// syncReplicaOn is syncReplica on conn, the dispatcher's own connection:
// the server that the grants it popped came from, or an error.
func (s *Semaphore) syncReplicaOn(ctx context.Context, conn *redis.Conn, bound time.Duration) (int, error) {
	var wait *redis.IntCmd
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, s.syncKey(), s.process, 2*s.opts.Lease)
		wait = redis.NewIntCmd(ctx, "wait", 1, bound.Milliseconds())
		return pipe.Process(ctx, wait)
	})
	if err != nil {
		return 0, err
	}
	return int(wait.Val()), nil
}

// syncReplica makes sure a replica has every write the primary made
// before it was called: it writes the sync key and waits, on the same
// connection, for a replica to acknowledge that write. It returns how
// many did within bound.
func (s *Semaphore) syncReplica(ctx context.Context, bound time.Duration) (int, error) {
	cmd := redis.NewStatusCmd(ctx, "set", s.syncKey(), s.process, "px", (2 * s.opts.Lease).Milliseconds())
	return s.callSynced(ctx, cmd, bound)
}

// confirmReplicated waits until a replica has the writes the primary made
// before it was called, for as long as Options.ReplicaWait since since
// (when the first WAIT for them was sent) and ctx allow. It returns nil
// once a replica acknowledged them, or once that bound has passed: then
// the caller goes on without a replica, with a warning, and the handle
// counts the primary as having none until a background check finds one
// in sync again (see replicated). Otherwise it returns ctx's error, or
// ErrClosed. acked is what the caller's own WAIT found, if it sent one
// (grantUnconfirmed if not).
func (s *Semaphore) confirmReplicated(ctx context.Context, acked int, since time.Time) error {
	var bo backoff.Backoff
	for {
		if acked > 0 || s.replicas.n.Load() == 0 {
			return nil
		}
		left := s.opts.ReplicaWait - time.Since(since)
		if left < time.Millisecond { // WAIT 1 0 would wait for ever
			s.replicas.mu.Lock()
			s.replicas.n.Store(0)
			s.replicas.checked = time.Now()
			s.replicas.mu.Unlock()
			s.log.Warn("semaphore: no replica acknowledged a write that a grant or limit rests on in time (a replica down or lagging, or, just after a failover, a new primary with no replica yet); going on without one until one is in sync: a failover meanwhile may lose it. Where that must not happen, see min-replicas-to-write in docs/semaphore.md",
				"bound", s.opts.ReplicaWait)
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w (no Redis replica acknowledged the write)", err)
		}
		if s.stopped() {
			return ErrClosed
		}
		n, err := s.syncReplica(ctx, min(left, s.waitBound))
		acked = n
		if err != nil {
			acked = grantUnconfirmed
			if perr := s.pause(ctx, min(bo.Next(), left)); errors.Is(perr, ErrClosed) {
				return perr
			}
		}
	}
}

// confirmGrant hands over token's grant of fence once a replica has it,
// for a grant that no WAIT on the connection that made it confirmed (acked
// is what one found, if one was sent). Before it hands the grant over, it
// asks the primary whether token still holds it: after a failover to a
// replica that never had it, the promoted one does not know it, and token
// re-queues, as after any lost place.
func (s *Semaphore) confirmGrant(ctx context.Context, token string, fence int64, acked int) error {
	since := time.Now()
	if acked == 0 {
		since = since.Add(-s.waitBound) // a whole WAIT went unacknowledged
	}
	var bo backoff.Backoff
	for {
		if err := s.confirmReplicated(ctx, acked, since); err != nil {
			return err
		}
		lease := s.opts.Lease.Milliseconds()
		sent := time.Now()
		res, err := s.eval(ctx, scriptRefresh, lease, lease, token)
		if err != nil {
			if ctx.Err() != nil || !mayPass(err) {
				return err
			}
			if perr := s.pause(ctx, bo.Next()); perr != nil {
				return perr
			}
			continue
		}
		st := int64(-1)
		if vals, _ := res.([]any); len(vals) == 1 {
			st, _ = vals[0].(int64)
		}
		switch {
		case st == fence:
			s.deliver(token, fence, sent, grantReplicated)
		case st == 0:
			// Queued, not granted: the primary lost the grant but not the
			// place (a failover); it is refreshed, and woken when granted.
		default:
			s.requeue(token)
		}
		return nil
	}
}

// A replicaAck, in the context of a script call, asks call to pipeline
// WAIT after the script and receives how many replicas acknowledged it.
type replicaAck struct{ n atomic.Int64 }

type replicaAckKey struct{}

// What deliver is told of a grant's replication.
const (
	grantReplicated  = 1  // a replica has it, or none need have it
	grantUnconfirmed = -1 // no WAIT was made for it
)

// askReplica returns ctx marked so that the script call made with it is
// followed by a WAIT, when this handle's grants must wait for a replica;
// otherwise ctx itself and nil.
func (s *Semaphore) askReplica(ctx context.Context) (context.Context, *replicaAck) {
	if !s.replicated(ctx) {
		return ctx, nil
	}
	a := &replicaAck{}
	a.n.Store(grantUnconfirmed)
	return context.WithValue(ctx, replicaAckKey{}, a), a
}

// acked is what deliver is told of a grant made by the call that a
// carried: grantReplicated without a WAIT to wait for.
func (a *replicaAck) acked() int {
	if a == nil {
		return grantReplicated
	}
	return int(a.n.Load())
}

// unconfirmed is what deliver is told of a grant that no WAIT of ours
// followed (a wake-up, a refresh's report). A handle that has not yet
// learnt whether the primary has replicas asks now.
func (s *Semaphore) unconfirmed() int {
	if s.opts.ReplicaWait < 0 || s.replicas.n.Load() == 0 {
		return grantReplicated
	}
	ctx, cancel := bounded(context.Background(), releaseTimeout)
	defer cancel()
	if !s.replicated(ctx) {
		return grantReplicated
	}
	return grantUnconfirmed
}

// replyError is an error reply that firstWait read: a redis.Error.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}
