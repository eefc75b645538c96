//go:build unix

package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// PrivateRedisCluster starts a one-node Redis Cluster of the test's own,
// a redis-server in cluster mode on a loopback TCP port that holds every
// slot, and returns once the cluster is ok. Its URL is
// redis://127.0.0.1:PORT, a plain URL of a cluster node; its Client is a
// plain client of the node, whose INFO commandstats counts only what the
// test sends. It is for tests that must tell what a client of theirs did
// to a cluster (the shared one of RedisCluster serves every test at
// once). With certs, the node takes TLS only, as PrivateRedisTLS's server
// does (its URL is rediss://127.0.0.1:PORT), its cluster bus too. The
// server stops when the test ends (and, on Linux, when the test binary
// dies). The test is skipped when redis-server is not on PATH.
func PrivateRedisCluster(t testing.TB, certs *TLSCerts) *RedisServer {
	t.Helper()
	bin := redisServerBinary(t)
	// The bus's default port, the node's plus 10000, may be past 65535.
	bus, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus)}
	var s *RedisServer
	if certs != nil {
		s = PrivateRedisTLS(t, certs, certs.Server, append(args, "--tls-cluster", "yes")...)
		s.URL = strings.TrimSuffix(s.URL, "/0")
	} else {
		s = privateClusterNode(t, bin, args)
	}
	ctx := context.Background()
	if err := s.Client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("testenv: giving the cluster node its slots: %v", err)
	}
	WaitFor(t, 20*time.Second, "the one-node cluster to be ok", func() bool {
		info, err := s.Client.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	return s
}

// privateClusterNode starts a redis-server of args on a loopback TCP port.
func privateClusterNode(t testing.TB, bin string, args []string) *RedisServer {
	t.Helper()
	dir := tempDir(t, "batchmr-cluster-")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := &RedisServer{t: t, bin: bin, URL: "redis://" + addr, logFile: filepath.Join(dir, "redis.log"),
		Client: redis.NewClient(&redis.Options{Addr: addr})}
	s.argv = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", s.logFile}, args...)
	t.Cleanup(func() {
		_ = s.Client.Close()
		s.Kill()
		_ = os.RemoveAll(dir)
	})
	s.Start()
	return s
}

// PrivateRedisClusterReplica starts a replica of primary, a node that
// PrivateRedisCluster started without TLS, and returns once the cluster
// knows it and it is in sync. It stops when the test ends.
func PrivateRedisClusterReplica(t testing.TB, primary *RedisServer) *RedisServer {
	t.Helper()
	bus, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	r := privateClusterNode(t, primary.bin, []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus)})
	ctx := context.Background()
	// Its bus port is not its port plus 10000: CLUSTER NODES says which.
	nodes, err := primary.Client.ClusterNodes(ctx).Result()
	if err != nil {
		t.Fatalf("testenv: CLUSTER NODES: %v", err)
	}
	var bus2 string
	for _, line := range strings.Split(nodes, "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.Contains(f[2], "myself") {
			_, bus2, _ = strings.Cut(strings.SplitN(f[1], ",", 2)[0], "@")
		}
	}
	host, port, _ := strings.Cut(primary.Client.Options().Addr, ":")
	if err := r.Client.Do(ctx, "CLUSTER", "MEET", host, port, bus2).Err(); err != nil {
		t.Fatalf("testenv: CLUSTER MEET: %v", err)
	}
	replicate(t, r, primary)
	WaitFor(t, 20*time.Second, "the cluster replica in sync", func() bool {
		return inSync(ctx, r, primary)
	})
	return r
}
