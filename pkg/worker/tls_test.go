package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/worker"
)

// A whole run over TLS everywhere: Redis with a private CA that requires
// a client certificate, Postgres with sslmode=verify-full. Every page's
// query runs under a permit, on a connection that pg_stat_ssl shows
// encrypted.
func TestAWorkerCompletesARunOverRedisMTLSAndPostgresVerifyFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	certs := testenv.TLSCertificates(t)
	redisSrv := testenv.PrivateRedisTLS(t, certs, certs.Server)
	pg := testenv.PrivatePostgres(t, testenv.PostgresTLS(t, certs.Server)...)
	dbURL := strings.Replace(pg.URL, "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(certs.CA), 1)
	job := pagesJob("tlsdoubles", func(ctx context.Context, p int) (int, error) {
		pool, sem, err := worker.Database(ctx)
		if err != nil {
			return 0, err
		}
		var doubled int
		var ssl bool
		err = sem.Do(ctx, func(ctx context.Context) error {
			return pool.QueryRow(ctx, "SELECT $1::int * 2, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", p).Scan(&doubled, &ssl)
		})
		if err == nil && !ssl {
			err = errors.New("the page's query ran on a connection without TLS")
		}
		return doubled, err
	}, mapreduce.JobOptions{})
	prefix := testenv.Prefix(t)
	wctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() {
		stopped <- worker.Run(wctx, worker.Config{RedisURL: redisSrv.URL, RedisCAFile: certs.CA,
			RedisCertFile: certs.Client.Cert, RedisKeyFile: certs.Client.Key, DatabaseURL: dbURL,
			Prefix: prefix, PollInterval: 10 * time.Millisecond, Logger: quietLog()}, job)
	}()
	mr := mustClient(t, redisSrv.Client, prefix)
	id, err := job.Start(ctx, mr, 20, mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := mr.Wait(wait, id)
	if err != nil || st.State != mapreduce.StateSucceeded {
		select {
		case err := <-stopped:
			t.Fatalf("the worker stopped: %v", err)
		default:
		}
		t.Fatalf("run %s: %+v, %v; want succeeded", id, st, err)
	}
	if sum, err := job.Result(st); err != nil || sum != 2*(19*20/2) {
		t.Errorf("result %d, %v; want %d", sum, err, 2*(19*20/2))
	}
	stop()
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// The worker binary takes the TLS flags from its environment, runs a job
// over mTLS, refuses a URL's skip_verify=true without
// --redis-insecure-skip-verify, and warns when it is given.
func TestTheWorkerBinaryTakesTheRedisTLSFlagsAndRefusesSkipVerifyUnlessSpelledOut(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	srv := testenv.PrivateRedisTLS(t, certs, certs.Server)
	prefix := testenv.Prefix(t)
	bin := testenv.Build(t, "./testdata/squares")
	env := append(os.Environ(), "BATCHMR_PREFIX="+prefix, "REDIS_URL="+srv.URL,
		"REDIS_CERT_FILE="+certs.Client.Cert, "REDIS_KEY_FILE="+certs.Client.Key)
	args := []string{"--permits", "cpu=2", "--poll-interval", "20ms"}

	refused := startProc(t, bin, env, append(args, "--redis-url", srv.URL+"?skip_verify=true")...)
	if st, err := refused.cmd.Process.Wait(); err != nil || st.ExitCode() != 2 {
		t.Errorf("skip_verify=true without the flag: %v, %v; want exit 2, a bad command line", st, err)
	}
	<-refused.eof
	if out := refused.output(); !strings.Contains(out, "--redis-insecure-skip-verify") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("skip_verify=true without the flag: stderr %q; want one line naming --redis-insecure-skip-verify", out)
	}

	insecure := startProc(t, bin, env, append(args, "--redis-url", srv.URL+"?skip_verify=true", "--redis-insecure-skip-verify")...)
	verified := startProc(t, bin, append(env, "REDIS_CA_FILE="+certs.CA), args...)
	mr := mustClient(t, srv.Client, prefix)
	waitAnnounced(t, mr, "squares", 2)
	id, err := mr.StartJSON(context.Background(), "squares", []byte(`{"n": 100, "page_size": 10}`), mapreduce.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := mr.Wait(wait, id); err != nil || st.State != mapreduce.StateSucceeded || string(st.Result) != "328350" {
		t.Errorf("run %s: %+v, %v; want succeeded with 328350", id, st, err)
	}
	for _, p := range []*proc{insecure, verified} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if st, err := p.cmd.Process.Wait(); err != nil || !st.Success() {
			t.Errorf("worker after SIGTERM: %v, %v; want exit 0", st, err)
		}
		<-p.eof
	}
	if out := insecure.output(); !strings.Contains(out, "level=WARN msg=\"Redis's certificate is not verified (--redis-insecure-skip-verify)") {
		t.Errorf("a worker with --redis-insecure-skip-verify logged:\n%s\nwant a warning", out)
	}
	if out := verified.output(); strings.Contains(out, "not verified") {
		t.Errorf("a worker that verifies Redis warned:\n%s", out)
	}
}

// A DATABASE_URL to another host without sslmode lets pgx fall back to
// no TLS: the worker says so, and how to require it.
func TestAWorkerWarnsOfARemoteDatabaseURLWithoutSSLMode(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	_, prefix := testenv.Redis(t)
	var logs testenv.LogBuffer
	cfg := worker.Config{RedisURL: testenv.RedisURL(t), Prefix: prefix, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		DatabaseURL: "postgres://app@db.batchmr.invalid:5432/shop?connect_timeout=2"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := worker.Run(ctx, cfg, skewedJob); err == nil {
		t.Fatal("Run started with a database that does not exist")
	}
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "no sslmode, which pgx reads as prefer") ||
		!strings.Contains(out, "sslmode=verify-full&sslrootcert=FILE") {
		t.Errorf("logged %q; want a warning naming sslmode=verify-full", out)
	}
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
