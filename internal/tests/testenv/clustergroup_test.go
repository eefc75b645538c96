//go:build unix

package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// The group's URL reaches its cluster, each tag's keys land on the
// primary the options name, and that primary's replica copies them.
func TestPrivateRedisClusterGroupPutsTagsOnTheirPrimariesWhoseReplicasCopyThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tags := [3][]string{{"a", "b"}, {"c"}, {"d"}}
	g := testenv.PrivateRedisClusterGroup(t, testenv.ClusterGroupOptions{Tags: tags})
	opt, err := redis.ParseClusterURL(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	if len(opt.Addrs) != 6 {
		t.Errorf("the URL %s seeds %d nodes; want all 6", g.URL, len(opt.Addrs))
	}
	rdb := redis.NewClusterClient(opt)
	defer rdb.Close()
	for p, ts := range tags {
		for _, tag := range ts {
			if got := g.PrimaryOf(t, tag); got != p {
				t.Errorf("tag %s is on primary %d; want %d", tag, got, p)
			}
			key := "{" + tag + "}" + testenv.Prefix(t)
			if err := rdb.Set(ctx, key, "v", time.Minute).Err(); err != nil {
				t.Fatalf("SET through %s: %v", g.URL, err)
			}
			if got := g.Primaries[p].Client.Get(ctx, key).Val(); got != "v" {
				t.Errorf("primary %d holds %q under %s; want v", p, got, key)
			}
			testenv.WaitFor(t, 10*time.Second, "the replica to copy the key", func() bool {
				pl := g.Replicas[p].Client.Pipeline() // one connection: READONLY holds for it
				pl.ReadOnly(ctx)
				get := pl.Get(ctx, key)
				_, _ = pl.Exec(ctx)
				return get.Val() == "v"
			})
		}
	}
}
