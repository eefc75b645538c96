package testenv_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

func TestRedisKeysUnderTheTestsPrefixAreDeletedWhenItEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, _ := testenv.Redis(t)
	var prefix string
	t.Run("inner", func(t *testing.T) {
		rdb, p := testenv.Redis(t)
		prefix = p
		if err := rdb.Set(ctx, p+":a", 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(ctx, p+":{tag}:b", "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
	})
	if n := len(admin.Keys(ctx, prefix+"*").Val()); n != 0 {
		t.Errorf("%d keys under %s survived the test", n, prefix)
	}
}

// The shared Cluster is three primaries, each with a replica in sync;
// keys of the test's prefix are deleted on every primary when it ends.
func TestSharedClusterKeysUnderTheTestsPrefixAreDeletedOnEveryPrimary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, _ := testenv.RedisCluster(t)
	var prefix string
	t.Run("inner", func(t *testing.T) {
		rdb, p := testenv.RedisCluster(t)
		prefix = p
		for _, tag := range testenv.TagsOnDifferentPrimaries(t, rdb, 3) {
			if err := rdb.Set(ctx, p+":{"+tag+"}:k", 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(testenv.KeysByPrimary(t, rdb, p)); n != 3 {
			t.Errorf("the keys are on %d primaries, want 3", n)
		}
	})
	if keys := testenv.KeysByPrimary(t, admin, prefix); len(keys) != 0 {
		t.Errorf("keys under %s survived the test: %v", prefix, keys)
	}
	err := admin.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, "role:master") && !strings.Contains(info, "master_link_status:up") {
			t.Errorf("replica %s is not in sync:\n%s", node.Options().Addr, info)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The shared Sentinel group's URL reaches its primary, whose replica copies
// what it is told; keys of the test's prefix are deleted when it ends.
func TestSharedSentinelKeysReachTheReplicaAndAreDeletedWhenTheTestEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opt, err := redis.ParseFailoverURL(testenv.RedisSentinelURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.ReplicaOnly = true
	replica := redis.NewFailoverClient(opt)
	defer replica.Close()
	var key string
	t.Run("inner", func(t *testing.T) {
		rdb, p := testenv.RedisSentinel(t)
		key = p + ":k"
		if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the replica to copy the key", func() bool {
			return replica.Get(ctx, key).Val() == "v"
		})
	})
	testenv.WaitFor(t, 10*time.Second, "the key's deletion to reach the replica", func() bool {
		n, err := replica.Exists(ctx, key).Result()
		return err == nil && n == 0
	})
}

func TestPrefixesAreUniqueAndFreeOfHashTags(t *testing.T) {
	t.Parallel()
	a, b := testenv.Prefix(t), testenv.Prefix(t)
	if a == b {
		t.Errorf("two prefixes are equal: %s", a)
	}
	if strings.ContainsAny(a, "{}") {
		t.Errorf("prefix %s contains hash-tag braces", a)
	}
}

func TestPostgresGivesEachTestItsOwnSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var schema string
	t.Run("inner", func(t *testing.T) {
		pool, s := testenv.Postgres(t)
		schema = s
		if _, err := pool.Exec(ctx, "CREATE TABLE orders (id bigint primary key)"); err != nil {
			t.Fatal(err)
		}
		other, _ := testenv.Postgres(t)
		var n int
		if err := other.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'orders'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Error("a second test's schema sees the first test's table")
		}
	})
	pool, _ := testenv.Postgres(t)
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("schema %s survived its test", schema)
	}
}

func TestBinariesBuildEachPackageOnceUnderItsOwnNameUntilRemoved(t *testing.T) {
	t.Parallel()
	var b testenv.Binaries
	first := b.Build(t, "./testdata/hello")
	if again := b.Build(t, "./testdata/hello"); again != first {
		t.Errorf("a second Build of one package gave %s, want the first binary %s", again, first)
	}
	if filepath.Base(first) != "hello" {
		t.Errorf("the binary is %s, want it named after its package directory, hello", first)
	}
	if out, err := exec.Command(first).Output(); err != nil || string(out) != "hello\n" {
		t.Errorf("running the binary: %q, %v", out, err)
	}
	b.Remove()
	if _, err := os.Stat(first); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Remove, the binary: %v, want it gone", err)
	}
}
