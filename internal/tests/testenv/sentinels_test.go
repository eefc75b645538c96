//go:build unix

package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// The group's URL reaches its primary through the Sentinels, with the
// passwords where go-redis's Sentinel URL puts them, and the replica
// copies what the primary is told.
func TestPrivateSentinelsURLReachesThePrimaryWhoseReplicaCopiesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{Password: "data-pw", SentinelPassword: "sentinel-pw"})
	opt, err := redis.ParseFailoverURL(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewFailoverClient(opt)
	defer rdb.Close()
	key := testenv.Prefix(t) + ":k"
	if err := rdb.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET through %s: %v", g.URL, err)
	}
	if got := g.Primary.Client.Get(ctx, key).Val(); got != "v" {
		t.Errorf("the primary holds %q; want v", got)
	}
	testenv.WaitFor(t, 10*time.Second, "the replica to copy the key", func() bool {
		return g.Replica.Client.Get(ctx, key).Val() == "v"
	})
}
