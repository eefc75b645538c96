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
	ports := freePorts(t, 5)
	sv := sentinelServers{t: t, bin: bin, dir: dir, o: o}
	if o.TLS != nil {
		pair, err := tls.LoadX509KeyPair(o.TLS.Client.Cert, o.TLS.Client.Key)
		if err != nil {
			t.Fatal(err)
		}
		sv.clientTLS = &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	}
	g := &SentinelGroup{Primary: sv.data("primary", ports[0])}
	g.Primary.Start()
	g.Replica = sv.data("replica", ports[1], "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
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
		s := sv.server(name, o.SentinelPassword, port, file, "--sentinel")
		s.Start()
		g.Sentinels = append(g.Sentinels, s)
		sentinelAddrs = append(sentinelAddrs, loopback(port))
	}
	ctx := context.Background()
	WaitFor(t, 60*time.Second, "the replica to be in sync and every Sentinel to know the primary, the replica and the other Sentinels", func() bool {
		if !linkUp(ctx, g.Replica) {
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
	g.URL = sentinelURL(o, sentinelAddrs)
	return g
}

// sentinelServers makes the servers of a SentinelGroup, each with its log
// in dir, over TLS with o.TLS.
type sentinelServers struct {
	t         testing.TB
	bin, dir  string
	o         SentinelOptions
	clientTLS *tls.Config
}

// server makes, without starting it, a redis-server of argv listening on
// port (its TLS port alone with o.TLS), whose Client authenticates with
// password. It stops when the test ends.
func (sv sentinelServers) server(name, password string, port int, argv ...string) *RedisServer {
	t, o := sv.t, sv.o
	if o.TLS == nil {
		argv = append(argv, "--port", strconv.Itoa(port))
	} else {
		argv = append(argv, "--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", o.TLS.Server.Cert, "--tls-key-file", o.TLS.Server.Key,
			"--tls-client-cert-file", o.TLS.Client.Cert, "--tls-client-key-file", o.TLS.Client.Key,
			"--tls-ca-cert-file", o.TLS.CA, "--tls-auth-clients", "yes", "--tls-replication", "yes")
	}
	s := &RedisServer{t: t, bin: sv.bin, argv: argv, logFile: filepath.Join(sv.dir, name+".log"),
		Client: redis.NewClient(&redis.Options{Addr: loopback(port), Password: password, Protocol: 2, TLSConfig: sv.clientTLS})}
	t.Cleanup(func() {
		_ = s.Client.Close()
		s.Kill()
	})
	return s
}

// data makes, without starting it, a data server (the primary or the
// replica) of args, without persistence, with o.Password.
func (sv sentinelServers) data(name string, port int, args ...string) *RedisServer {
	argv := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", sv.dir, "--dbfilename", name + ".rdb", "--logfile", filepath.Join(sv.dir, name+".log")}
	if sv.o.Password != "" {
		argv = append(argv, "--requirepass", sv.o.Password, "--masterauth", sv.o.Password)
	}
	return sv.server(name, sv.o.Password, port, append(argv, args...)...)
}

// sentinelURL is the Sentinel URL of a group whose Sentinels listen on
// addrs.
func sentinelURL(o SentinelOptions, addrs []string) string {
	u := url.URL{Scheme: "redis", Host: addrs[0], Path: "/0"}
	if o.TLS != nil {
		u.Scheme = "rediss"
	}
	if o.SentinelPassword != "" {
		u.User = url.UserPassword("", o.SentinelPassword)
	}
	q := url.Values{"master_name": {SentinelMaster}, "addr": addrs[1:]}
	if o.Password != "" {
		q.Set("password", o.Password)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// loopback is the address of port on 127.0.0.1.
func loopback(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

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
