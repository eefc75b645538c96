//go:build unix

package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/cgroupcpu"
	"github.com/jackc/pgx/v5"
)

// PostgresServer is a Postgres server of the test's own, started by
// PrivatePostgres. Its methods must be called from the test's goroutine.
type PostgresServer struct {
	// URL locates the server's "postgres" database as its superuser
	// "postgres", over TCP on 127.0.0.1, for a pool or a subprocess's
	// DATABASE_URL. It stays the same across Stop and Start.
	URL string

	t        testing.TB
	bindir   string
	data     string // the data directory
	dir      string // the server's temp dir: data, unix socket, log
	logFile  string
	port     int
	settings []string // -c name=value, each
	cred     *syscall.Credential
	cmd      *exec.Cmd
	exited   chan struct{}    // closed when cmd has exited; nil while stopped
	cpu      *cgroupcpu.Group // LimitCPU's, once called
}

// PostgresStop is how Stop shuts a server down: Postgres's shutdown modes.
type PostgresStop int

const (
	// StopFast ends every session and shuts down cleanly, as a restart
	// for maintenance does (pg_ctl stop -m fast).
	StopFast PostgresStop = iota
	// StopImmediate aborts every process at once, as a crash does; the
	// next Start recovers from the WAL (pg_ctl stop -m immediate).
	StopImmediate
)

// PrivatePostgres starts a Postgres server of the test's own, in a fresh
// data directory (initdb --no-sync, trust authentication) in a temp dir,
// on a free port of 127.0.0.1, with fsync off, and returns it once it
// accepts connections. settings are extra server settings, "name=value"
// each (as postgres -c takes them). As root it runs the server as the
// "postgres" user (or batchmr-test, which scripts/with-servers.sh creates),
// since Postgres refuses to run as root. The server stops and its
// directory is removed when the test ends; on Linux it also dies with the
// test binary. The test is skipped when no Postgres server binaries
// (initdb, postgres) are installed, and fails when the server does not
// start.
//
// It is for tests that take the database away: stop it, start it again
// with its data, restart it; tests that only need a database use Postgres.
func PrivatePostgres(t testing.TB, settings ...string) *PostgresServer {
	t.Helper()
	bindir, err := postgresBinDir()
	if err != nil {
		t.Skipf("testenv: this test starts a Postgres server of its own: %v", err)
	}
	s := &PostgresServer{t: t, bindir: bindir, settings: settings}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresUser(); err != nil {
			t.Skipf("testenv: this test starts a Postgres server of its own: %v", err)
		}
	}
	// Not t.TempDir: the server's user must reach it, and a unix socket
	// path must stay short.
	if s.dir, err = os.MkdirTemp("", "batchmr-pg-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.stop(StopImmediate)
		_ = os.RemoveAll(s.dir)
	})
	s.data = filepath.Join(s.dir, "data")
	s.logFile = filepath.Join(s.dir, "postgres.log")
	if err := os.Chmod(s.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if s.cred != nil {
		// The server writes its socket and lock files next to its data.
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	initdb := s.command(filepath.Join(bindir, "initdb"), "-D", s.data, "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C.UTF-8")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	// A free port may be taken before the server binds it: try another.
	for attempt := 1; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
		err := s.start()
		if err == nil {
			return s
		}
		log, _ := os.ReadFile(s.logFile)
		if attempt == 5 || !strings.Contains(string(log), "could not bind") {
			t.Fatalf("testenv: the test's Postgres: %v\n%s", err, log)
		}
	}
}

// Stop shuts the server down in mode and waits for it to exit; clients'
// connections fail and new ones are refused until Start. It does nothing
// when the server is not running.
func (s *PostgresServer) Stop(mode PostgresStop) {
	s.t.Helper()
	s.stop(mode)
}

// Start starts the server again, with its data directory, port and
// settings, and returns once it accepts connections (after crash recovery,
// following StopImmediate). It fails the test when the server does not
// start within 60s. It does nothing when the server is running.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		log, _ := os.ReadFile(s.logFile)
		s.t.Fatalf("testenv: the test's Postgres: %v\n%s", err, log)
	}
}

// Restart stops the server in mode and starts it again.
func (s *PostgresServer) Restart(mode PostgresStop) {
	s.t.Helper()
	s.Stop(mode)
	s.Start()
}

// command runs a Postgres program as the server's user, in its directory.
func (s *PostgresServer) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	// Unlike runuser, which forks and waits, this makes the server itself
	// the test binary's child: the parent-death signal reaches it.
	cmd.SysProcAttr = dieWithParent()
	if s.cred != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Credential = s.cred
	}
	// The caller's PG* variables must not redirect the tools.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
	return cmd
}

func (s *PostgresServer) start() error {
	if s.exited != nil {
		return nil
	}
	args := []string{"-D", s.data, "-p", strconv.Itoa(s.port), "-k", s.dir,
		// fsync off spares the disk; commits stay synchronous, so that a
		// crash (StopImmediate) loses no committed transaction, as with a
		// production server that crashed.
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200"}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	log, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := s.command(filepath.Join(s.bindir, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.exited = cmd, done
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			_ = c.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-done:
			s.exited = nil
			return fmt.Errorf("postgres exited at start (%v)", err)
		default:
		}
		if time.Now().After(deadline) {
			s.stop(StopImmediate)
			return fmt.Errorf("postgres did not accept connections within 60s (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *PostgresServer) stop(mode PostgresStop) {
	if s.exited == nil {
		return
	}
	sig := syscall.SIGINT // fast shutdown
	if mode == StopImmediate {
		sig = syscall.SIGQUIT
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.exited = nil
}

// postgresBinDir finds the directory of the Postgres server binaries as
// scripts/with-servers.sh does: next to an initdb on PATH, else the newest
// /usr/lib/postgresql/VERSION/bin (Debian keeps them off PATH).
func postgresBinDir() (string, error) {
	var cand []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if p, err = filepath.EvalSymlinks(p); err == nil {
			cand = append(cand, filepath.Dir(p))
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // newest version first
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, dir := range append(cand, dirs...) {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no initdb and postgres found (on PATH or in /usr/lib/postgresql/*/bin): install postgresql (make test does)")
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// postgresUser returns the credentials of the user a root test process
// runs Postgres as.
func postgresUser() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "batchmr-test"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
		}
	}
	return nil, fmt.Errorf("as root, Postgres must run as another user, and there is no postgres user: create one (apt-get install postgresql does), or run the tests as another user")
}

// freePort returns a TCP port of 127.0.0.1 that nobody listens on now,
// for a server that binds it later. It is picked at random below the
// kernel's ephemeral range (ip_local_port_range), not by listening on
// port 0: a port of that range can be taken, before the server binds it
// or while a test has it stopped, as the source port of any outgoing
// connection on the machine, and make test makes thousands.
func freePort() (int, error) {
	low := ephemeralLow()
	for range 100 {
		port := 10000 + rand.IntN(low-10000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			_ = ln.Close()
			return port, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range, or
// 32768 (Linux's default) when it cannot be read or leaves too few ports
// below it.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low >= 12000 {
				return low
			}
		}
	}
	return 32768
}

// freePorts returns n loopback TCP ports free at the time of the call.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		var err error
		if ports[i], err = freePort(); err != nil {
			t.Fatal(err)
		}
	}
	return ports
}
