package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// PrivateRedis starts a redis-server of the test's own, configured with
// args (redis-server command-line options, such as "--maxmemory", "2mb"),
// and returns a client of it and a function that restarts it: kill -9 and
// start again, empty, as a server without persistence comes back. The
// server stops when the test ends (and, on Linux, when the test binary
// dies). It is for tests that change what a shared server must keep as it
// is: its memory limit, its data, its life. It listens on a unix socket, so
// it needs no free port. Call it and restart from the test's goroutine. The
// test is skipped when redis-server is not on PATH (make test installs it).
func PrivateRedis(t testing.TB, args ...string) (rdb *redis.Client, restart func()) {
	t.Helper()
	s := PrivateRedisServer(t, args...)
	return s.Client, s.Restart
}

// RedisServer is a redis-server of the test's own, started by
// PrivateRedisServer. Its methods must be called from the test's goroutine.
type RedisServer struct {
	// Client is a client of the server. It reconnects by itself after Kill
	// and Start.
	Client *redis.Client
	// URL locates the server for a subprocess's REDIS_URL:
	// "unix://<socket path>" (PrivateRedisTLS: "rediss://127.0.0.1:PORT/0").
	URL string
	// Socket is the path of the server's unix socket (PrivateRedisTLS:
	// none).
	Socket string

	t       testing.TB
	bin     string
	argv    []string
	logFile string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited; nil while stopped
	output  bytes.Buffer  // what it wrote before its log file opened
}

// PrivateRedisServer starts a redis-server of the test's own, as
// PrivateRedis does, and returns it so that the test can kill it and start
// it again separately: with "--appendonly", "yes" among args it comes back
// with its data, as a production Redis with AOF does (docs/operations.md).
// The server stops and its directory is removed when the test ends; on
// Linux it also dies with the test binary. The test is skipped when
// redis-server is not on PATH.
func PrivateRedisServer(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin := redisServerBinary(t)
	// A short path: unix socket paths are limited to ~100 bytes.
	dir := tempDir(t, "batchmr-redis-")
	s := &RedisServer{t: t, bin: bin, Socket: filepath.Join(dir, "redis.sock"), logFile: filepath.Join(dir, "redis.log")}
	s.URL = "unix://" + s.Socket
	s.argv = append([]string{"--port", "0", "--unixsocket", s.Socket, "--unixsocketperm", "700",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", s.logFile}, args...)
	s.Client = redis.NewClient(&redis.Options{Network: "unix", Addr: s.Socket})
	t.Cleanup(func() {
		_ = s.Client.Close()
		s.Kill()
		_ = os.RemoveAll(dir)
	})
	s.Start()
	return s
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit. It does nothing when the server is not running.
func (s *RedisServer) Kill() {
	if s.exited == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.exited = nil
}

// Pid is the server's process ID while it runs (0 otherwise), for a test
// that pauses it with SIGSTOP.
func (s *RedisServer) Pid() int {
	if s.exited == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Restart kills the server and starts it again.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Kill()
	s.Start()
}

// Start starts the server with the options and directory it had, and
// returns once it answers PING; it fails the test when it exits or does
// not answer within 20s. It does nothing when the server is running.
func (s *RedisServer) Start() {
	t := s.t
	t.Helper()
	if s.exited != nil {
		return
	}
	c := exec.Command(s.bin, s.argv...)
	s.output.Reset()
	c.Stdout, c.Stderr = &s.output, &s.output
	c.SysProcAttr = dieWithParent()
	if err := c.Start(); err != nil {
		t.Fatalf("testenv: starting redis-server: %v", err)
	}
	done := make(chan struct{})
	s.cmd, s.exited = c, done
	go func() { _ = c.Wait(); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := s.Client.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		fail := ""
		select {
		case <-done:
			fail = "exited at start"
		default:
			if time.Now().After(deadline) {
				fail = "did not answer within 20s"
			}
		}
		if fail != "" {
			log, _ := os.ReadFile(s.logFile)
			s.Kill() // output is complete once it has exited
			t.Fatalf("testenv: the test's redis-server %s (%v)\n%s%s", fail, err, s.output.String(), log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisServerBinary returns the path of redis-server, skipping the test
// when none is on PATH (make test installs it).
func redisServerBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("testenv: this test starts redis-servers of its own and none is on PATH: install redis-server (make test does)")
	}
	return bin
}

// tempDir makes a directory named prefix... under the system's temp
// directory, whose short path a unix socket's fits in (unlike
// t.TempDir's); the caller removes it.
func tempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
