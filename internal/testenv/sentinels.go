//go:build unix

package testenv

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name under which PrivateSentinels's Sentinels
// monitor their primary.
const SentinelMaster = "batchmr"

// SentinelGroup is a Redis primary, one replica of it and three
// Sentinels that monitor it, of the test's own: PrivateSentinels.
type SentinelGroup struct {
	// URL is the Sentinel URL of the group, as --redis-url takes it:
	// redis://[:SentinelPassword@]127.0.0.1:PORT/0?master_name=batchmr&addr=...&addr=...
	// with password=Password when the servers require one.
	URL string
	// Primary and Replica are the data servers; Sentinels the three
	// Sentinels, whose Clients speak the Sentinel protocol's commands
	// through Do.
	Primary, Replica *RedisServer
	Sentinels        []*RedisServer
}

// SentinelOptions are the passwords of a SentinelGroup; the zero value
// sets none.
type SentinelOptions struct {
	// Password is the primary's and the replica's (requirepass,
	// masterauth, and each Sentinel's auth-pass).
	Password string
	// SentinelPassword is the Sentinels' own (requirepass, and
	// sentinel-pass between them).
	SentinelPassword string
	// TLS, if not nil, makes every server and Sentinel take TLS only,
	// with certificates of TLS.CA (Server's, and Client's when they
	// connect to each other), and require client certificates; the URL
	// is then rediss://.
	TLS *TLSCerts
	// DownAfter is how long the Sentinels wait for an unanswering primary
	// before they fail it over (down-after-milliseconds). Default 10s,
	// which a loaded machine does not cross by chance; a test that kills
	// the primary sets a second or so to fail over sooner.
	DownAfter time.Duration
}

// PrivateSentinels starts a Redis primary, one replica of it
// (--replicaof) and three Sentinels that monitor it as SentinelMaster
// with a quorum of 2, all on loopback TCP ports, and returns once every
// Sentinel knows the primary, the replica and the other two Sentinels and
// the replica is in sync. The servers stop when the test ends (and, on
// Linux, when the test binary dies). The test is skipped when
// redis-server is not on PATH (make test installs it).
func PrivateSentinels(t testing.TB, o SentinelOptions) *SentinelGroup {
	t.Helper()
	bin := redisServerBinary(t)
	downAfter := o.DownAfter
	if downAfter == 0 {
		downAfter = 10 * time.Second
	}
	dir := tempDir(t, "batchmr-sentinels-")
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ports := make([]int, 5)
	for i := range ports {
		var err error
		if ports[i], err = freePort(); err != nil {
			t.Fatal(err)
		}
	}
	addr := func(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
	var clientTLS *tls.Config
	if o.TLS != nil {
		pair, err := tls.LoadX509KeyPair(o.TLS.Client.Cert, o.TLS.Client.Key)
		if err != nil {
			t.Fatal(err)
		}
		clientTLS = &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	}
	// listen is where a server listens: port, or its TLS port alone.
	listen := func(port int) []string {
		if o.TLS == nil {
			return []string{"--port", strconv.Itoa(port)}
		}
		return []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", o.TLS.Server.Cert, "--tls-key-file", o.TLS.Server.Key,
			"--tls-client-cert-file", o.TLS.Client.Cert, "--tls-client-key-file", o.TLS.Client.Key,
			"--tls-ca-cert-file", o.TLS.CA, "--tls-auth-clients", "yes", "--tls-replication", "yes"}
	}
	server := func(name, password string, port int, argv ...string) *RedisServer {
		s := &RedisServer{t: t, bin: bin, argv: append(argv, listen(port)...), logFile: filepath.Join(dir, name+".log"),
			Client: redis.NewClient(&redis.Options{Addr: addr(port), Password: password, Protocol: 2, TLSConfig: clientTLS})}
		t.Cleanup(func() {
			_ = s.Client.Close()
			s.Kill()
		})
		return s
	}
	data := func(name string, port int, args ...string) *RedisServer {
		argv := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--dbfilename", name + ".rdb", "--logfile", filepath.Join(dir, name+".log")}
		if o.Password != "" {
			argv = append(argv, "--requirepass", o.Password, "--masterauth", o.Password)
		}
		return server(name, o.Password, port, append(argv, args...)...)
	}
	g := &SentinelGroup{Primary: data("primary", ports[0])}
	g.Primary.Start()
	g.Replica = data("replica", ports[1], "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
	g.Replica.Start()
	var sentinelAddrs []string
	for i, port := range ports[2:] {
		name := fmt.Sprintf("sentinel%d", i+1)
		conf := []string{
			"bind 127.0.0.1", "dir " + dir, "logfile " + filepath.Join(dir, name+".log"),
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", SentinelMaster, ports[0]),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMaster, downAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s 5000", SentinelMaster),
		}
		if o.Password != "" {
			conf = append(conf, fmt.Sprintf("sentinel auth-pass %s %s", SentinelMaster, o.Password))
		}
		if o.SentinelPassword != "" {
			conf = append(conf, "requirepass "+o.SentinelPassword, "sentinel sentinel-pass "+o.SentinelPassword)
		}
		file := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(file, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := server(name, o.SentinelPassword, port, file, "--sentinel")
		s.Start()
		g.Sentinels = append(g.Sentinels, s)
		sentinelAddrs = append(sentinelAddrs, addr(port))
	}
	ctx := context.Background()
	WaitFor(t, 60*time.Second, "the replica to be in sync and every Sentinel to know the primary, the replica and the other Sentinels", func() bool {
		info, err := g.Replica.Client.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "master_link_status:up") {
			return false
		}
		for _, s := range g.Sentinels {
			m, err := s.Client.Do(ctx, "SENTINEL", "MASTER", SentinelMaster).Slice()
			if err != nil || field(m, "num-slaves") != "1" || field(m, "num-other-sentinels") != "2" || field(m, "flags") != "master" {
				return false
			}
		}
		return true
	})
	u := url.URL{Scheme: "redis", Host: sentinelAddrs[0], Path: "/0"}
	if o.TLS != nil {
		u.Scheme = "rediss"
	}
	if o.SentinelPassword != "" {
		u.User = url.UserPassword("", o.SentinelPassword)
	}
	q := url.Values{"master_name": {SentinelMaster}, "addr": sentinelAddrs[1:]}
	if o.Password != "" {
		q.Set("password", o.Password)
	}
	u.RawQuery = q.Encode()
	g.URL = u.String()
	return g
}

// field is the value of name in a Sentinel's flat reply of names and
// values (SENTINEL MASTER), or "".
func field(reply []any, name string) string {
	for i := 0; i+1 < len(reply); i += 2 {
		if reply[i] == name {
			s, _ := reply[i+1].(string)
			return s
		}
	}
	return ""
}
