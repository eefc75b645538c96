package main_test

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// tlsFleet is a fleet on a Redis of the test's own that takes TLS only,
// with certificates of a private CA, and requires client certificates.
func tlsFleet(t *testing.T) (*fleet, *testenv.RedisServer, *testenv.TLSCerts) {
	t.Helper()
	certs := testenv.TLSCertificates(t)
	srv := testenv.PrivateRedisTLS(t, certs, certs.Server)
	prefix := testenv.Prefix(t)
	mr, err := mapreduce.New(srv.Client, mapreduce.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, rdb: srv.Client, prefix: prefix, mr: mr}, srv, certs
}

// 'run --wait' starts a run over TLS with a private CA and a client
// certificate, from the environment or from flags, and prints its result;
// the console serves over the same settings. Without the CA, the command
// stops at once, naming the cause and --redis-ca-file.
func TestRunWaitAndTheConsoleWorkOverRedisMTLSWithAPrivateCA(t *testing.T) {
	t.Parallel()
	f, srv, certs := tlsFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := &scheduler{t: t, bin: schedulerBinary(t), env: append(os.Environ(), "REDIS_URL="+srv.URL, "BATCHMR_PREFIX="+f.prefix,
		"REDIS_CERT_FILE="+certs.Client.Cert, "REDIS_KEY_FILE="+certs.Client.Key)}

	out, errs, code := s.with("REDIS_CA_FILE="+certs.CA).run("run", "sum", "--args", `{"n": 100, "page_size": 10}`, "--wait")
	if got := lines(out); code != 0 || len(got) != 2 || got[1] != "5050" {
		t.Fatalf("run --wait over mTLS (env): exit %d, stdout %q, stderr %q; want the run ID then 5050", code, out, errs)
	}
	id := lines(out)[0]
	out, errs, code = s.run("status", id, "--redis-ca-file", certs.CA)
	if code != 0 || !strings.Contains(out, "succeeded") {
		t.Errorf("status over mTLS (--redis-ca-file): exit %d, stdout %q, stderr %q; want the run succeeded", code, out, errs)
	}

	_, errs, code = s.run("status", id)
	if code != 1 || !oneLine(errs) || !strings.Contains(errs, "signed by an unknown authority") || !strings.Contains(errs, "--redis-ca-file (env REDIS_CA_FILE)") {
		t.Errorf("status without the CA: exit %d, stderr %q; want exit 1, one line naming the unknown authority and --redis-ca-file", code, errs)
	}
	_, errs, code = s.with("REDIS_CA_FILE="+certs.CA, "REDIS_CERT_FILE=", "REDIS_KEY_FILE=").run("jobs")
	if code != 1 || !oneLine(errs) || !strings.Contains(errs, "requires a client certificate") || !strings.Contains(errs, "--redis-cert-file and --redis-key-file") {
		t.Errorf("jobs without a client certificate: exit %d, stderr %q; want exit 1, one line naming --redis-cert-file", code, errs)
	}
	_, errs, code = s.with("REDIS_URL=" + srv.URL + "?skip_verify=true").run("runs")
	if code != 1 || !oneLine(errs) || !strings.Contains(errs, "--redis-insecure-skip-verify") {
		t.Errorf("runs with skip_verify=true alone: exit %d, stderr %q; want exit 1 naming --redis-insecure-skip-verify", code, errs)
	}

	p := s.with("REDIS_CA_FILE="+certs.CA).start("ui", "--listen", "127.0.0.1:0", "--read-only")
	url := consoleAt(t, p, "http")
	resp, err := http.Get(url + "jobs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `data-job="sum"`) {
		t.Errorf("the console over mTLS: GET /jobs: %d, want the jobs page listing sum:\n%s", resp.StatusCode, body)
	}
	p.interrupt(10 * time.Second)
}

// Every command takes the Redis TLS flags.
func TestEveryCommandTakesTheRedisTLSFlags(t *testing.T) {
	t.Parallel()
	s := newScheduler(t, newFleet(t))
	for _, cmd := range []string{"jobs", "run", "serve", "status", "runs", "cancel", "retry", "permits", "ui"} {
		out, errs, code := s.run(cmd, "--help")
		for _, flag := range []string{"-redis-ca-file", "-redis-cert-file", "-redis-key-file", "-redis-insecure-skip-verify"} {
			if code != 0 || !strings.Contains(out+errs, flag) {
				t.Errorf("scheduler %s --help: exit %d, no %s in\n%s", cmd, code, flag, out+errs)
			}
		}
	}
}
