//go:build unix

package testenv

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

// PrivateRedisTLS starts a redis-server of the test's own, as
// PrivateRedisServer does, that listens only on a TLS port of 127.0.0.1:
// it presents server (certs.Server, or Expired or WrongName to test a
// client's refusal) and requires of clients a certificate signed by
// certs.CA (Redis's tls-auth-clients yes); args follow, such as
// "--tls-auth-clients", "no". Its URL is rediss://127.0.0.1:PORT/0. Its
// Client presents certs.Client and does not verify the server, so that a
// server with a bad certificate starts too: the code under test gets the
// URL and the files. The test is skipped when redis-server is not on PATH.
func PrivateRedisTLS(t testing.TB, certs *TLSCerts, server CertPair, args ...string) *RedisServer {
	t.Helper()
	bin := redisServerBinary(t)
	dir := tempDir(t, "batchmr-redis-tls-")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := &RedisServer{t: t, bin: bin, URL: "rediss://" + addr + "/0", logFile: filepath.Join(dir, "redis.log")}
	s.argv = append([]string{"--port", "0", "--bind", "127.0.0.1", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", server.Cert, "--tls-key-file", server.Key, "--tls-ca-cert-file", certs.CA,
		"--tls-auth-clients", "yes",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", s.logFile}, args...)
	client, err := tls.LoadX509KeyPair(certs.Client.Cert, certs.Client.Key)
	if err != nil {
		t.Fatal(err)
	}
	s.Client = redis.NewClient(&redis.Options{Addr: addr,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{client}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() {
		_ = s.Client.Close()
		s.Kill()
		_ = os.RemoveAll(dir)
	})
	s.Start()
	return s
}

// PostgresTLS returns the settings that make a PrivatePostgres serve TLS
// with server's certificate: PrivatePostgres(t, PostgresTLS(t,
// certs.Server)...). The key is copied so that the server's user owns
// it, with mode 0600, as Postgres requires. The server still accepts
// connections without TLS (its URL's sslmode=disable).
func PostgresTLS(t testing.TB, server CertPair) []string {
	t.Helper()
	dir := tempDir(t, "batchmr-pg-tls-")
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	for _, f := range []struct {
		from, to string
		mode     os.FileMode
	}{{server.Cert, cert, 0o644}, {server.Key, key, 0o600}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.to, b, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		cred, err := postgresUser()
		if err != nil {
			t.Skipf("testenv: %v", err)
		}
		if err := os.Chown(key, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(fmt.Errorf("testenv: giving the server's user its key: %w", err))
		}
	}
	return []string{"ssl=on", "ssl_cert_file=" + cert, "ssl_key_file=" + key}
}
