package mapreduce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replication is asynchronous: a replica promoted in a failover may lack
// the last writes its primary acknowledged. A run's creation (Start: a
// run whose ID the caller got, and a scheduler's tick, must not vanish)
// and the writes exactly-once rests on — a page's record, the split's
// total, a run's end — are synced: where the primary has a replica, they go in one round trip with WAIT 1
// replicaWait after them, on the same connection (WAIT covers that
// connection's writes), and return only once a replica has them. A
// deployment without replicas sends no WAIT with its writes and waits for
// nothing.
//
// Whether the primary has replicas is asked on a connection of its own
// that never writes (INFO and ROLE need @dangerous, which an ACL for
// batchmr leaves out): WAIT 0 0, which answers at once with the replicas
// that acknowledged the connection's last write, and, if that is none,
// WAIT 1 replicaAsk. A connection that never wrote is not always taken for
// one at offset 0 (Redis 7.0: WAIT 0 0 on a new connection counted none
// while its only replica's last acknowledgement, sent each second, was
// behind), and WAIT 1 has the primary ask its replicas for an
// acknowledgement at once. A batcher asks before its first synced write —
// without replicas, that costs its job's first synced write in a process
// replicaAsk — then every replicaRecheck in the background, and again
// after a WAIT that no replica answered.
const (
	// replicaWait bounds how long a synced write waits for a replica.
	// Past it, the write fails as transient and is retried: its script is
	// idempotent.
	replicaWait = time.Second
	// replicaRecheck is how long a batcher trusts its count of replicas.
	replicaRecheck = 5 * time.Second
	// replicaAsk bounds how long asking for replicas waits for one.
	replicaAsk = 50 * time.Millisecond
)

// waitArgs is the WAIT of a synced write.
var waitArgs = []any{"WAIT", 1, replicaWait.Milliseconds()}

// errNotReplicated is the error of a synced write that no replica
// acknowledged within replicaWait. It is transient: withRedis retries it.
var errNotReplicated = errors.New("no replica acknowledged the write within " + replicaWait.String())

// replicas is what a batcher knows of its primary's replicas.
type replicas struct {
	mu      sync.Mutex
	known   bool
	n       int64     // replicas connected, if known
	checked time.Time // when n was counted
	asking  bool      // a recount is under way
}

// count returns how many replicas node, the primary of the batcher's
// keys, has: what the batcher knows when it is fresh; a count it makes
// now when it knows nothing; what it knows, recounted in the background,
// when that is stale. It is 0 when the primary cannot be asked.
func (r *replicas) count(ctx context.Context, node *redis.Client) int64 {
	r.mu.Lock()
	switch {
	case r.known && time.Since(r.checked) < replicaRecheck:
	case r.known:
		if !r.asking {
			r.asking = true
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
				defer cancel()
				r.set(countReplicas(ctx, node))
			}()
		}
	default:
		r.mu.Unlock()
		r.set(countReplicas(ctx, node))
		r.mu.Lock()
	}
	n := r.n
	r.mu.Unlock()
	return n
}

func (r *replicas) set(n int64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.known, r.n, r.checked, r.asking = err == nil, n, time.Now(), false
}

// forget makes the next count ask again.
func (r *replicas) forget() {
	r.mu.Lock()
	r.known, r.n = false, 0
	r.mu.Unlock()
}

// countReplicas asks node how many replicas it has, with WAIT 0 0 on a
// connection of its own (see above).
func countReplicas(ctx context.Context, node *redis.Client) (int64, error) {
	c := redis.NewClient(askOptions(node.Options()))
	defer c.Close()
	n, err := c.Do(ctx, "WAIT", 0, 0).Int64()
	if err != nil || n > 0 {
		return n, err
	}
	return c.Do(ctx, "WAIT", 1, replicaAsk.Milliseconds()).Int64()
}

// askOptions are the options of a client that reaches the server o does,
// as o's client does (its dialer, which follows a Sentinel failover, its
// credentials and TLS), for one connection and nothing else: none of the
// state o's client may share with its clones (push notification
// handlers, a client-side cache), which a second client on the same
// options would register again, and RESP2, which needs none of it.
func askOptions(o *redis.Options) *redis.Options {
	return &redis.Options{
		Network: o.Network, Addr: o.Addr, Dialer: o.Dialer, ClientName: o.ClientName, Protocol: 2,
		Username: o.Username, Password: o.Password,
		CredentialsProvider: o.CredentialsProvider, CredentialsProviderContext: o.CredentialsProviderContext,
		DB: o.DB, TLSConfig: o.TLSConfig, DisableIdentity: true,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolSize:              1, MaxRetries: -1,
	}
}

// node returns the client of the primary that holds the batcher's keys,
// whose connections a synced trip may hold for its WAIT: the client itself
// for one server or Sentinel (go-redis's failover client is a
// *redis.Client), the primary of the job's slot on Cluster. ok is false
// for a client of another kind, whose writes go unsynced.
func (b *batcher) node(ctx context.Context) (node *redis.Client, ok bool, err error) {
	switch c := b.rdb.(type) {
	case *redis.Client:
		return c, true, nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, "{"+b.tag+"}")
		return node, err == nil, err
	}
	return nil, false, nil
}

// tripSynced is trip for calls some of which are synced: it sends them in
// one pipeline on one connection of their primary, with WAIT after them
// where the primary has a replica, and fails the synced calls with
// errNotReplicated when no replica acknowledged them in time.
func (b *batcher) tripSynced(calls []*batchCall) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	node, ok, err := b.node(ctx)
	if !ok {
		if err != nil {
			for _, call := range calls {
				call.err = err
			}
			return
		}
		b.tripOn(b.rdb.Pipeline(), calls)
		return
	}
	if b.replicas.count(ctx, node) == 0 {
		b.tripOn(b.rdb.Pipeline(), calls) // as unsynced: a Cluster client follows MOVED
		return
	}
	conn := node.Conn()
	defer conn.Close()
	pl := conn.Pipeline()
	if !b.fill(pl, calls) {
		return
	}
	wait := pl.Do(ctx, waitArgs...)
	cmds, err := pl.Exec(ctx)
	b.settle(calls, cmds, err)
	b.reloadOnMoved(ctx, cmds)
	var werr error
	switch acked, err := wait.Int64(); {
	case err != nil:
		werr = fmt.Errorf("%w: %w", errNotReplicated, err)
	case acked < 1:
		werr = errNotReplicated
	}
	if werr == nil {
		return
	}
	b.replicas.forget() // the replica may be gone
	for _, call := range calls {
		if call.sync && call.err == nil {
			call.err = werr
		}
	}
}

// reloadOnMoved has a Cluster client reload its slots when a synced trip,
// which went to the node it believed held the job's slot, was told that
// another does.
func (b *batcher) reloadOnMoved(ctx context.Context, cmds []redis.Cmder) {
	c, ok := b.rdb.(*redis.ClusterClient)
	if !ok {
		return
	}
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")) {
			c.ReloadState(ctx)
			return
		}
	}
}
