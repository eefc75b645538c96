package testenv_test

import (
	"context"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/testenv"
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
