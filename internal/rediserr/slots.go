package rediserr

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Cluster client keeps its map of slots to primaries until a MOVED
// reply, a READONLY one, or the map's age (ClusterStateReloadInterval,
// a minute) has it reload. A primary killed outright sends neither: the
// client retries the dead address for each command and gives up, and keeps
// doing so after the replica is promoted, until the minute is up. So every
// node client of a Cluster client that batchmr makes or is given reloads
// the map when a command fails in a way that says the map may be stale
// (StaleSlots), at most once per reloadEvery: during a failover that is a
// CLUSTER SLOTS every reloadEvery, and the first after the promotion finds
// the new primary.

// reloadEvery bounds how often a Cluster client reloads its slots on
// errors.
const reloadEvery = 250 * time.Millisecond

// slotReloader is the hook that reloads c's slots on errors of its nodes.
type slotReloader struct {
	c      *redis.ClusterClient
	last   atomic.Int64 // when a reload was last asked, in UnixNano
	stale  atomic.Int64 // when a node last failed with a stale-map error, in UnixNano
	hooked sync.Map     // *redis.Client → struct{}: the nodes it is on
}

// reloaders holds the reloader of each Cluster client that has one.
var reloaders sync.Map // *redis.ClusterClient → *slotReloader

// ReloadSlotsOnErrors makes c reload its slots when a command fails with a
// stale-map error (StaleSlots). It hooks the client itself, which sees
// every command routed through it once go-redis's own retries are spent,
// and each node client c makes from now on, which sees each attempt and
// the commands of a connection taken from a node (MasterForKey). It is
// idempotent: app.Redis calls it on the clients it makes, mapreduce.New
// and semaphore.New on the clients they are given.
func ReloadSlotsOnErrors(c *redis.ClusterClient) {
	v, loaded := reloaders.LoadOrStore(c, &slotReloader{c: c})
	if loaded {
		return
	}
	r := v.(*slotReloader)
	c.OnNewNode(r.hook)
	c.AddHook(r)
}

// SlotsStaleWithin reports whether a node of c (a client that
// ReloadSlotsOnErrors hooked) failed with a stale-map error within the
// last d: a failover of one of its primaries may be under way.
func SlotsStaleWithin(c *redis.ClusterClient, d time.Duration) bool {
	v, ok := reloaders.Load(c)
	return ok && time.Since(time.Unix(0, v.(*slotReloader).stale.Load())) < d
}

// hook adds r to node's hooks, once.
func (r *slotReloader) hook(node *redis.Client) {
	if _, done := r.hooked.LoadOrStore(node, struct{}{}); !done {
		node.AddHook(r)
	}
}

func (r *slotReloader) seen(err error) {
	if !StaleSlots(err) {
		return
	}
	now := time.Now().UnixNano()
	r.stale.Store(now)
	last := r.last.Load()
	if now-last < int64(reloadEvery) || !r.last.CompareAndSwap(last, now) {
		return
	}
	r.c.ReloadState(context.Background()) // in the background: it returns at once
}

func (r *slotReloader) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		r.seen(err)
		return conn, err
	}
}

func (r *slotReloader) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.seen(err)
		return err
	}
}

func (r *slotReloader) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		r.seen(err)
		for _, cmd := range cmds {
			r.seen(cmd.Err())
		}
		return err
	}
}
