package app

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/redis/go-redis/v9"
)

// A Cluster client keeps its map of slots to primaries until a MOVED
// reply, a READONLY one, or the map's age (ClusterStateReloadInterval,
// a minute) has it reload. A primary killed outright sends neither: the
// client retries the dead address for each command and gives up, and keeps
// doing so after the replica is promoted, until the minute is up. So every
// node client of a Cluster client made here reloads the map when a command
// fails in a way that says the map may be stale (rediserr.StaleSlots), at
// most once per reloadEvery: during a failover that is a CLUSTER SLOTS
// every reloadEvery, and the first after the promotion finds the new
// primary.

// reloadEvery bounds how often a Cluster client reloads its slots on
// errors.
const reloadEvery = 250 * time.Millisecond

// slotReloader is the hook that reloads c's slots on errors of its nodes.
type slotReloader struct {
	c    *redis.ClusterClient
	last atomic.Int64 // when a reload was last asked, in UnixNano
}

// reloadSlotsOnErrors makes c reload its slots when a command to one of
// its nodes fails with a stale-map error; call it before c's first
// command, so that every node's client gets the hook.
func reloadSlotsOnErrors(c *redis.ClusterClient) {
	r := &slotReloader{c: c}
	c.OnNewNode(func(node *redis.Client) { node.AddHook(r) })
}

func (r *slotReloader) seen(err error) {
	if !rediserr.StaleSlots(err) {
		return
	}
	now := time.Now().UnixNano()
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
