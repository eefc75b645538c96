// Package testenv gives each test a real Redis and a real Postgres, isolated
// from every other test and from whatever else the servers hold.
//
// Servers come from, in order:
//  1. BATCHMR_TEST_REDIS_URL and BATCHMR_TEST_DATABASE_URL (make test starts
//     throwaway servers and sets both);
//  2. otherwise, when a Docker engine answers, containers started once per
//     test binary with testcontainers-go;
//  3. otherwise the test fails with a message naming both fixes.
//
// The shared Redis Cluster (RedisCluster) and Sentinel group
// (RedisSentinel) come only from BATCHMR_TEST_REDIS_CLUSTER_ADDRS and
// BATCHMR_TEST_REDIS_SENTINEL_URL, which make test sets to a six-node
// Cluster and a Sentinel group of its own; testcontainers-go starts
// neither, so without them those tests are skipped, saying so. Tests that
// stop, cut or fail over servers start their own (PrivateRedisCluster,
// PrivateSentinels) and leave the shared ones alone.
//
// Isolation is by name, never by flushing: every test gets its own key
// prefix and its own Postgres schema, and removes only those when it ends, so
// tests run in parallel and are safe against a shared server.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// The variables that point tests at existing servers.
const (
	RedisURLVar    = "BATCHMR_TEST_REDIS_URL"
	DatabaseURLVar = "BATCHMR_TEST_DATABASE_URL"
	// The shared Cluster's seeds, host:port,host:port,...
	RedisClusterAddrsVar = "BATCHMR_TEST_REDIS_CLUSTER_ADDRS"
	// The shared Sentinel group, in go-redis's Sentinel URL form:
	// redis://sentinel/0?master_name=NAME&addr=sentinel2&addr=sentinel3
	RedisSentinelURLVar = "BATCHMR_TEST_REDIS_SENTINEL_URL"
)

var (
	serversOnce sync.Once
	redisURL    string
	databaseURL string
	serversErr  error
)

// servers resolves the two server URLs once per test binary.
func servers(t testing.TB) (string, string) {
	t.Helper()
	serversOnce.Do(func() {
		redisURL, databaseURL = os.Getenv(RedisURLVar), os.Getenv(DatabaseURLVar)
		if redisURL != "" && databaseURL != "" {
			return
		}
		redisURL, databaseURL, serversErr = startContainers()
	})
	if serversErr != nil {
		t.Fatalf("batchmr tests need a real Redis and a real Postgres. Either run `make test`, "+
			"which starts throwaway servers and sets %s and %s, or set both to servers of your own; "+
			"or run a Docker engine so that testcontainers-go can start them (it failed: %v)",
			RedisURLVar, DatabaseURLVar, serversErr)
	}
	return redisURL, databaseURL
}

// startContainers starts Redis and Postgres with testcontainers-go. The
// containers live as long as the test binary; testcontainers' reaper removes
// them when it exits.
func startContainers() (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rc, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "redis:7-alpine",
			ExposedPorts: []string{"6379/tcp"},
			WaitingFor:   wait.ForLog("Ready to accept connections"),
		},
		Started: true,
	})
	if err != nil {
		return "", "", err
	}
	redisAddr, err := rc.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		return "", "", err
	}
	pc, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "postgres:16-alpine",
			ExposedPorts: []string{"5432/tcp"},
			Env:          map[string]string{"POSTGRES_PASSWORD": "batchmr", "POSTGRES_DB": "batchmr_test"},
			WaitingFor:   wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
		},
		Started: true,
	})
	if err != nil {
		return "", "", err
	}
	pgAddr, err := pc.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		return "", "", err
	}
	return "redis://" + redisAddr + "/0", "postgres://postgres:batchmr@" + pgAddr + "/batchmr_test?sslmode=disable", nil
}

// RedisURL returns the URL of the test Redis server.
func RedisURL(t testing.TB) string {
	t.Helper()
	u, _ := servers(t)
	return u
}

// DatabaseURL returns the URL of the test Postgres database.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	_, u := servers(t)
	return u
}

// Redis returns a client of the test Redis server and a key prefix that no
// other test uses. Every key under the prefix is deleted when the test ends.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("%s: %v", RedisURLVar, err)
	}
	rdb := redis.NewClient(opt)
	prefix := Prefix(t)
	t.Cleanup(func() {
		deleteKeys(t, rdb, prefix)
		_ = rdb.Close()
	})
	return rdb, prefix
}

// RedisClusterAddrs returns the seeds of the shared Redis Cluster,
// host:port each. The test is skipped when BATCHMR_TEST_REDIS_CLUSTER_ADDRS
// is unset (make test sets it to a Cluster of three primaries and three
// replicas that it starts).
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(RedisClusterAddrsVar)
	if v == "" {
		t.Skipf("no Redis Cluster: set %s to its nodes' host:port, comma-separated (make test starts one)", RedisClusterAddrsVar)
	}
	return strings.Split(v, ",")
}

// RedisCluster returns a client of the shared Redis Cluster and a key
// prefix that no other test uses; every key under the prefix is deleted,
// on every primary, when the test ends. The test is skipped as
// RedisClusterAddrs says. Keys of different hash tags land on different
// primaries: a multi-key script must keep to one tag.
func RedisCluster(t testing.TB) (*redis.ClusterClient, string) {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: RedisClusterAddrs(t)})
	prefix := Prefix(t)
	t.Cleanup(func() {
		err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
			deleteKeys(t, node, prefix)
			return nil
		})
		if err != nil {
			t.Logf("testenv: deleting %s* on the cluster's primaries: %v", prefix, err)
		}
		_ = rdb.Close()
	})
	return rdb, prefix
}

// RedisSentinelURL returns the Sentinel URL of the shared Sentinel group
// (a primary, its replica and three Sentinels), in go-redis's form, which
// --redis-url takes. The test is skipped when
// BATCHMR_TEST_REDIS_SENTINEL_URL is unset (make test sets it to a group
// it starts).
func RedisSentinelURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(RedisSentinelURLVar)
	if u == "" {
		t.Skipf("no Sentinel group: set %s to redis://SENTINEL/0?master_name=NAME&addr=SENTINEL2... (make test starts one)", RedisSentinelURLVar)
	}
	return u
}

// RedisSentinel returns a client of the shared Sentinel group's primary,
// found through its Sentinels, and a key prefix that no other test uses.
// Every key under the prefix is deleted when the test ends. The test is
// skipped as RedisSentinelURL says.
func RedisSentinel(t testing.TB) (*redis.Client, string) {
	t.Helper()
	opt, err := redis.ParseFailoverURL(RedisSentinelURL(t))
	if err != nil {
		t.Fatalf("%s: %v", RedisSentinelURLVar, err)
	}
	rdb := redis.NewFailoverClient(opt)
	prefix := Prefix(t)
	t.Cleanup(func() {
		deleteKeys(t, rdb, prefix)
		_ = rdb.Close()
	})
	return rdb, prefix
}

// Prefix returns a name unique to this test run: the test's name (so that
// leftovers are traceable) and random bytes (so that -count and parallel
// binaries never collide). It contains no Redis hash-tag braces.
func Prefix(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return "bmrtest:" + name + ":" + hex.EncodeToString(b[:])
}

func deleteKeys(t testing.TB, rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("testenv: scanning %s* for cleanup: %v", prefix, err)
	}
	for _, k := range keys {
		// One key at a time: keys of different slots cannot share a DEL on a cluster.
		if err := rdb.Del(ctx, k).Err(); err != nil {
			t.Logf("testenv: deleting %s: %v", k, err)
		}
	}
}

// Postgres returns a pool on the test database whose search_path is a schema
// of its own, and the schema's name. The schema and everything in it is
// dropped when the test ends.
func Postgres(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	url := DatabaseURL(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "bmrtest_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testenv: connecting to %s (%s): %v", DatabaseURLVar, url, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("testenv: creating schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Logf("testenv: dropping schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("testenv: dropping schema %s: %v", schema, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("testenv: %s: %v", DatabaseURLVar, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, fmt.Sprint(schema)
}

// Queue returns an asynq queue name unique to the test (derived from its
// key prefix), whose keys are deleted when the test ends: asynq has no key
// prefix of its own, but every key of a queue carries the queue's name.
func Queue(t testing.TB, rdb *redis.Client, prefix string) string {
	t.Helper()
	queue := strings.ReplaceAll(prefix, ":", "-")
	RemoveQueue(t, rdb, queue)
	return queue
}

// RemoveQueue removes asynq queue's keys when the test ends: asynq has no
// key prefix of its own, but every key of a queue carries the queue's
// name.
func RemoveQueue(t testing.TB, rdb *redis.Client, queue string) {
	t.Cleanup(func() {
		deleteKeys(t, rdb, "asynq:{"+queue+"}:")
		rdb.SRem(context.Background(), "asynq:queues", queue)
	})
}

// JobQueue returns the asynq queue of job under prefix (a job's own queue
// by default, "<prefix>:<job>") and removes the queue's keys when the test
// ends.
func JobQueue(t testing.TB, rdb *redis.Client, prefix, job string) string {
	t.Helper()
	queue := prefix + ":" + job
	RemoveQueue(t, rdb, queue)
	return queue
}

// DatabaseURLIn returns the test database's URL with schema as search_path,
// for a subprocess that must see the test's own tables.
func DatabaseURLIn(t testing.TB, schema string) string {
	t.Helper()
	url := DatabaseURL(t)
	if strings.Contains(url, "?") {
		return url + "&search_path=" + schema
	}
	return url + "?search_path=" + schema
}

// Build compiles the main package at pkg (a path relative to the test's
// package) into the test's temp dir and returns the binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	abs, err := filepath.Abs(pkg)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(abs))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("testenv: building %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// KeysInOneSlot fails the test unless the cluster holds at least min keys
// under prefix (besides extra, which the caller found otherwise) and all of
// them hash to one slot: what every multi-key script of a package needs.
func KeysInOneSlot(t testing.TB, rdb *redis.ClusterClient, prefix string, min int, extra ...string) {
	t.Helper()
	ctx := context.Background()
	keys := append([]string(nil), extra...)
	var mu sync.Mutex
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < min {
		t.Fatalf("found only %v, want at least %d keys", keys, min)
	}
	want := rdb.ClusterKeySlot(ctx, keys[0]).Val()
	for _, k := range keys {
		if slot := rdb.ClusterKeySlot(ctx, k).Val(); slot != want {
			t.Errorf("key %s is in slot %d, others in %d", k, slot, want)
		}
	}
}

// TagsOnDifferentPrimaries returns n names whose hash tags ("{name}" in a
// key) fall in slots of n different primaries of rdb's cluster, so that
// the test can show keys of different tags living apart. It fails the
// test when the cluster has fewer primaries.
func TagsOnDifferentPrimaries(t testing.TB, rdb *redis.ClusterClient, n int) []string {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	var names []string
	for i := 0; i < 1000 && len(names) < n; i++ {
		name := "tag" + strconv.Itoa(i)
		node, err := rdb.MasterForKey(ctx, "{"+name+"}")
		if err != nil {
			t.Fatal(err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			names = append(names, name)
		}
	}
	if len(names) < n {
		t.Fatalf("testenv: the cluster has %d primaries, the test needs %d", len(seen), n)
	}
	return names
}

// PrimariesOfTags returns the primary (its address) that holds the keys
// under prefix:{tag}: of each tag, failing t when a tag's keys stand on
// two primaries, and unless every tag's keys stand on a primary of
// their own, different from the others'. what names a tag in messages
// ("semaphore", "job").
func PrimariesOfTags(t testing.TB, rdb *redis.ClusterClient, prefix, what string, tags ...string) map[string]string {
	t.Helper()
	holders := map[string]string{} // tag -> the primary with its keys
	for addr, keys := range KeysByPrimary(t, rdb, prefix) {
		for _, k := range keys {
			for _, tag := range tags {
				if !strings.HasPrefix(k, prefix+":{"+tag+"}:") {
					continue
				}
				if other, ok := holders[tag]; ok && other != addr {
					t.Errorf("%s %s has keys on %s and on %s", what, tag, other, addr)
				}
				holders[tag] = addr
			}
		}
	}
	seen := map[string]bool{}
	for _, tag := range tags {
		if holders[tag] == "" || seen[holders[tag]] {
			t.Errorf("%ss %v keep their keys on %v; want each on a primary of its own", what, tags, holders)
			break
		}
		seen[holders[tag]] = true
	}
	return holders
}

// KeysByPrimary returns the keys under prefix that each primary of rdb's
// cluster holds, by the primary's address, scanning each one directly.
func KeysByPrimary(t testing.TB, rdb *redis.ClusterClient, prefix string) map[string][]string {
	t.Helper()
	var mu sync.Mutex
	keys := map[string][]string{}
	err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys[node.Options().Addr] = append(keys[node.Options().Addr], iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// Binaries builds main packages once per test binary, for packages whose
// tests start the same program many times: Build links it again for every
// test. Declare one in a package variable, and Remove its files in
// TestMain once m.Run has returned. It is safe for concurrent use.
type Binaries struct {
	mu    sync.Mutex
	dir   string // made on the first build
	built map[string]*binary
}

type binary struct {
	once sync.Once
	n    int // its subdirectory of dir: two packages may share a name
	path string
	err  error
}

// Build compiles the main package at pkg (a path relative to the test's
// package) the first time it is asked for, and returns the binary's path;
// the binary has the package directory's name, as with Build. It fails
// the test when the package does not build, every time it is asked for.
func (b *Binaries) Build(t testing.TB, pkg string) string {
	t.Helper()
	b.mu.Lock()
	if b.built == nil {
		b.built = map[string]*binary{}
	}
	bin, ok := b.built[pkg]
	if !ok {
		bin = &binary{n: len(b.built)}
		b.built[pkg] = bin
	}
	b.mu.Unlock()
	bin.once.Do(func() { bin.path, bin.err = b.build(pkg, bin.n) })
	if bin.err != nil {
		t.Fatalf("testenv: building %s: %v", pkg, bin.err)
	}
	return bin.path
}

func (b *Binaries) build(pkg string, n int) (string, error) {
	abs, err := filepath.Abs(pkg)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	if b.dir == "" {
		if b.dir, err = os.MkdirTemp("", "batchmr-bin-"); err != nil {
			b.dir = ""
			b.mu.Unlock()
			return "", err
		}
	}
	path := filepath.Join(b.dir, strconv.Itoa(n), filepath.Base(abs))
	b.mu.Unlock()
	if out, err := exec.Command("go", "build", "-o", path, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v\n%s", err, out)
	}
	return path, nil
}

// Remove deletes the binaries built so far.
func (b *Binaries) Remove() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// WaitFor polls cond every few milliseconds until it holds, failing the
// test after timeout. Tests use it to observe a state (a waiter queued, a
// run ended), never to time the code under test.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Eventually polls cond every few milliseconds until it holds, and reports
// whether it did within timeout (cond is called at least once). It is
// WaitFor for a test that says itself what a timeout means.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
