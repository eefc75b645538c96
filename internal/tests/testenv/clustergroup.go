//go:build unix

package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterGroup is a Redis Cluster of the test's own, three primaries with
// one replica each: PrivateRedisClusterGroup.
type ClusterGroup struct {
	// URL is the Cluster URL of every node, as --redis-url takes it:
	// redis://127.0.0.1:PORT?addr=127.0.0.1:PORT2&addr=...
	URL string
	// Primaries are the three primaries; Replicas[i] replicates
	// Primaries[i]. Their Clients are plain clients of each node.
	Primaries, Replicas []*RedisServer
	// Client is a cluster client seeded with every node.
	Client *redis.ClusterClient
}

// ClusterGroupOptions shape a ClusterGroup; the zero value is a cluster
// whose slots the three primaries share in three equal ranges, that
// fails a primary over once it has not answered for 5 s.
type ClusterGroupOptions struct {
	// NodeTimeout is cluster-node-timeout: how long a primary must not
	// answer before the others mark it failed and its replica is
	// promoted (about a second later). Default 5s, which a loaded machine
	// does not cross by chance; a test that kills a primary sets a second
	// or so to fail over sooner.
	NodeTimeout time.Duration
	// Tags[i] are hash tags (a key's part between { and }) whose slots
	// Primaries[i] holds, whichever range they fall in: a test places keys
	// on one primary, or on different ones, by naming their tags here.
	Tags [3][]string
}

// PrivateRedisClusterGroup starts a Redis Cluster of six redis-servers on
// loopback TCP ports, three primaries and a replica of each, and returns
// once every node knows the other five, the cluster is ok and every
// replica is in sync. A replica is promoted however long its link was
// down (cluster-replica-validity-factor 0). The servers stop when the test
// ends (and, on Linux, when the test binary dies). The test is skipped
// when redis-server is not on PATH.
func PrivateRedisClusterGroup(t testing.TB, o ClusterGroupOptions) *ClusterGroup {
	t.Helper()
	bin := redisServerBinary(t)
	timeout := o.NodeTimeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx := context.Background()
	nodes := make([]*RedisServer, 6)
	buses := freePorts(t, 6)
	for i := range nodes {
		nodes[i] = privateClusterNode(t, bin, []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(buses[i]),
			"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			"--cluster-replica-validity-factor", "0", "--cluster-announce-ip", "127.0.0.1"})
		// Distinct epochs up front, as redis-cli --cluster create sets
		// them, rather than collisions the nodes resolve over seconds.
		if err := nodes[i].Client.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			t.Fatalf("testenv: CLUSTER SET-CONFIG-EPOCH: %v", err)
		}
	}
	g := &ClusterGroup{Primaries: nodes[:3], Replicas: nodes[3:]}
	g.assignSlots(t, o.Tags)
	port0 := strings.TrimPrefix(nodes[0].Client.Options().Addr, "127.0.0.1:")
	for _, n := range nodes[1:] {
		if err := n.Client.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", port0, buses[0]).Err(); err != nil {
			t.Fatalf("testenv: CLUSTER MEET: %v", err)
		}
	}
	WaitFor(t, 30*time.Second, "every node of the cluster to know the other five", func() bool {
		for _, n := range nodes {
			info, err := n.Client.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_known_nodes:6\r") {
				return false
			}
		}
		return true
	})
	for i, r := range g.Replicas {
		replicate(t, r, g.Primaries[i])
	}
	WaitFor(t, 60*time.Second, "the cluster to be ok, with every node seeing three primaries and three replicas, each replica in sync", func() bool {
		for _, n := range nodes {
			info, err := n.Client.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			all, err := n.Client.ClusterNodes(ctx).Result()
			if err != nil || strings.Count(all, "slave") != 3 || strings.Count(all, "master") != 3 {
				return false
			}
		}
		for i, r := range g.Replicas {
			if !inSync(ctx, r, g.Primaries[i]) {
				return false
			}
		}
		return true
	})

	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Client.Options().Addr)
	}
	q := url.Values{"addr": addrs[1:]}
	g.URL = fmt.Sprintf("redis://%s?%s", addrs[0], q.Encode())
	g.Client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = g.Client.Close() })
	return g
}

// assignSlots gives each primary its slots: three equal ranges, then the
// slots of tags[i]'s hash tags to Primaries[i].
func (g *ClusterGroup) assignSlots(t testing.TB, tags [3][]string) {
	t.Helper()
	ctx := context.Background()
	owner := make([]int, 16384)
	for s := range owner {
		owner[s] = min(s*3/16384, 2)
	}
	for p, tags := range tags {
		for _, tag := range tags {
			slot, err := g.Primaries[0].Client.ClusterKeySlot(ctx, "{"+tag+"}").Result()
			if err != nil {
				t.Fatalf("testenv: CLUSTER KEYSLOT: %v", err)
			}
			owner[slot] = p
		}
	}
	for p, primary := range g.Primaries {
		args := []any{"CLUSTER", "ADDSLOTSRANGE"}
		for s := 0; s < len(owner); s++ {
			if owner[s] != p {
				continue
			}
			e := s
			for e+1 < len(owner) && owner[e+1] == p {
				e++
			}
			args = append(args, s, e)
			s = e
		}
		if err := primary.Client.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("testenv: giving primary %d its slots: %v", p, err)
		}
	}
}

// replicate makes cluster node r a replica of primary, a node of the same
// cluster, waiting up to 20s for r to know primary.
func replicate(t testing.TB, r, primary *RedisServer) {
	t.Helper()
	ctx := context.Background()
	id, err := primary.Client.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatalf("testenv: the cluster node's ID: %v", err)
	}
	WaitFor(t, 20*time.Second, "a node to replicate its primary", func() bool {
		return r.Client.Do(ctx, "CLUSTER", "REPLICATE", id).Err() == nil
	})
}

// linkUp reports whether replica r's link to its primary is up.
func linkUp(ctx context.Context, r *RedisServer) bool {
	info, err := r.Client.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "master_link_status:up")
}

// inSync reports whether replica r's link is up and r has acknowledged
// every write of primary (WAIT 1 within 100ms).
func inSync(ctx context.Context, r, primary *RedisServer) bool {
	if !linkUp(ctx, r) {
		return false
	}
	n, err := primary.Client.Do(ctx, "WAIT", 1, 100).Int()
	return err == nil && n == 1
}

// PrimaryOf returns the index in Primaries of the primary that holds the
// keys of hash tag tag, as the cluster's slot map says.
func (g *ClusterGroup) PrimaryOf(t testing.TB, tag string) int {
	t.Helper()
	node, err := g.Client.MasterForKey(context.Background(), "{"+tag+"}")
	if err != nil {
		t.Fatalf("testenv: the primary of {%s}: %v", tag, err)
	}
	addr := node.Options().Addr
	for i, p := range g.Primaries {
		if p.Client.Options().Addr == addr {
			return i
		}
	}
	t.Fatalf("testenv: {%s} is on %s, not one of the first primaries", tag, addr)
	return -1
}
