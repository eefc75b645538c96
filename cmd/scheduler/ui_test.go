package main_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// 'scheduler ui' serves the console of the deployment it points at, on the
// address it prints, until SIGINT.
func TestUIServesTheConsoleOfItsDeploymentUntilInterrupted(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host([]string{"db"}, sumJob("sum", nil))
	s := newScheduler(t, f)
	p := s.start("ui", "--listen", "127.0.0.1:0", "--read-only")
	url := consoleAt(t, p, "http")
	resp, err := http.Get(url + "jobs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `data-job="sum"`) || !strings.Contains(string(body), "read-only") {
		t.Errorf("GET /jobs: %d, want the read-only jobs page listing sum:\n%s", resp.StatusCode, body)
	}
	p.interrupt(10 * time.Second)
	out, errs, code := s.run("ui", "--help")
	if help := out + errs; code != 0 || !strings.Contains(help, "loopback") || !strings.Contains(help, "BATCHMR_UI_TOKEN") || !strings.Contains(help, "--read-only") {
		t.Errorf("ui --help: exit %d, want the loopback, token and read-only notes:\n%s", code, help)
	}
	out, _, _ = s.run("--help")
	if !strings.Contains(out, "scheduler ui") {
		t.Errorf("the usage does not list ui:\n%s", out)
	}
}

// 'scheduler serve' publishes its schedules with their next ticks while it
// runs, for the console, and withdraws them when it stops.
func TestServePublishesItsSchedulesWhileItRuns(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)
	p := s.start("serve", "--schedule", "sum=@every 1h", "--args", `sum={"n": 1, "page_size": 1}`)
	var list []schedules.Schedule
	testenv.WaitFor(t, 10*time.Second, "the published schedule", func() bool {
		list, _ = schedules.List(context.Background(), f.rdb, f.prefix)
		return len(list) == 1
	})
	if got := list[0]; got.Job != "sum" || got.Spec != "@every 1h" || !got.Next.After(time.Now()) || got.Next.After(time.Now().Add(time.Hour)) {
		t.Errorf("published %+v, want sum's @every 1h with its next tick within the hour", got)
	}
	if !p.interrupt(10 * time.Second) {
		t.FailNow()
	}
	if list, _ := schedules.List(context.Background(), f.rdb, f.prefix); len(list) != 0 {
		t.Errorf("after serve stopped its schedules are still published: %+v", list)
	}
}

// consoleAt waits for the console's address that p prints, as scheme
// (http or https) says.
func consoleAt(t *testing.T, p *proc, scheme string) string {
	t.Helper()
	addr := regexp.MustCompile(`console on (` + scheme + `://[^ ]+/) `)
	var u string
	testenv.WaitFor(t, 10*time.Second, "the console's address", func() bool {
		m := addr.FindStringSubmatch(p.stderr.String())
		if m != nil {
			u = m[1]
		}
		return m != nil
	})
	return u
}

// Reading shows every run's arguments, results and errors: beyond
// loopback the console starts only with a token, read-only or not, unless
// --insecure-no-auth says a proxy in front authenticates.
func TestUIRefusesToListenBeyondLoopbackWithoutAToken(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newScheduler(t, f)
	for _, args := range [][]string{
		{"ui", "--listen", "0.0.0.0:0"},
		{"ui", "--listen", ":0", "--read-only"},
	} {
		_, errs, code := s.run(args...)
		if code != 2 || !strings.Contains(errs, "BATCHMR_UI_TOKEN is unset") || !strings.Contains(errs, "--insecure-no-auth") || !strings.Contains(errs, "arguments, results and errors") {
			t.Errorf("%v: exit %d, want 2 and the fix; stderr:\n%s", args, code, errs)
		}
	}
	for name, sched := range map[string]*scheduler{
		"--insecure-no-auth": s,
		"a token":            s.with("BATCHMR_UI_TOKEN=s3cret-token"),
	} {
		args := []string{"ui", "--listen", "0.0.0.0:0", "--read-only"}
		if name == "--insecure-no-auth" {
			args = append(args, name)
		}
		p := sched.start(args...)
		consoleAt(t, p, "http")
		p.interrupt(10 * time.Second)
		if errs := p.stderr.String(); name == "a token" && (!strings.Contains(errs, "over plain HTTP") || !strings.Contains(errs, "BATCHMR_UI_TOKEN is short")) {
			t.Errorf("with a short token over plain HTTP beyond loopback, the console does not warn of both:\n%s", errs)
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key to PEM files
// and returns their paths and the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "console.pem"), filepath.Join(dir, "console-key.pem")
	return certFile, keyFile, writeSelfSigned(t, 1, certFile, keyFile)
}

// writeSelfSigned writes a certificate for 127.0.0.1 with serial to
// certFile and its key to keyFile, and returns the certificate.
func writeSelfSigned(t *testing.T, serial int64, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "batchmr console test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert
}

// With --tls-cert and --tls-key the console serves HTTPS with that
// certificate, prints an https URL, and its session cookie is Secure.
func TestUIServesHTTPSWithItsCertificateAndASecureCookie(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	certFile, keyFile, cert := selfSigned(t)
	const token = "s3cret-token"
	p := newScheduler(t, f).with("BATCHMR_UI_TOKEN="+token, "BATCHMR_UI_TLS_KEY="+keyFile).
		start("ui", "--listen", "127.0.0.1:0", "--tls-cert", certFile)
	base := consoleAt(t, p, "https")
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	client := &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	do := func(method, path string, form url.Values, header ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+strings.TrimPrefix(path, "/"), strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s over TLS: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := do(http.MethodGet, "/jobs", nil, "Authorization", "Bearer "+token); resp.StatusCode != http.StatusOK || resp.TLS == nil || !strings.Contains(body, `data-job="sum"`) {
		t.Errorf("GET /jobs over TLS with the token: %d, want 200 and the jobs page listing sum:\n%s", resp.StatusCode, body)
	}
	if resp, body := do(http.MethodGet, "/jobs", nil); resp.StatusCode != http.StatusSeeOther || strings.Contains(body, "sum") {
		t.Errorf("GET /jobs over TLS without the token: %d, want a redirect to the login page and nothing shown:\n%s", resp.StatusCode, body)
	}
	_, login := do(http.MethodGet, "/login", nil)
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(login)
	if m == nil {
		t.Fatalf("the login page has no CSRF token:\n%s", login)
	}
	resp, _ := do(http.MethodPost, "/login", url.Values{"csrf": {m[1]}, "token": {token}, "next": {"/jobs"}},
		"Origin", strings.TrimSuffix(base, "/"), "Sec-Fetch-Site", "same-origin")
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure {
		t.Errorf("login over TLS: %d, cookies %+v; want 303 and a Secure session cookie", resp.StatusCode, resp.Cookies())
	}
	plain, err := http.Get("http://" + strings.TrimPrefix(base, "https://") + "jobs")
	if err == nil {
		body, _ := io.ReadAll(plain.Body)
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK || strings.Contains(string(body), "sum") {
			t.Errorf("plain HTTP to the TLS console: %d, want a refusal:\n%s", plain.StatusCode, body)
		}
	}
	p.interrupt(10 * time.Second)
}

// Half a TLS pair, or files that hold none, stop the console before it
// serves, naming the flags and what to give.
func TestUIRefusesHalfATLSPairOrFilesThatHoldNone(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newScheduler(t, f)
	certFile, keyFile, _ := selfSigned(t)
	if _, errs, code := s.run("ui", "--listen", "127.0.0.1:0", "--tls-cert", certFile); code != 2 || !strings.Contains(errs, "--tls-cert and --tls-key go together") {
		t.Errorf("--tls-cert alone: exit %d, want 2 and the pair's rule; stderr:\n%s", code, errs)
	}
	if _, errs, code := s.with("BATCHMR_UI_TLS_KEY="+keyFile).run("ui", "--listen", "127.0.0.1:0"); code != 2 || !strings.Contains(errs, "--tls-cert and --tls-key go together") {
		t.Errorf("BATCHMR_UI_TLS_KEY alone: exit %d, want 2 and the pair's rule; stderr:\n%s", code, errs)
	}
	if _, errs, code := s.run("ui", "--listen", "127.0.0.1:0", "--tls-cert", keyFile, "--tls-key", certFile); code != 1 || !strings.Contains(errs, "--tls-cert "+keyFile) || !strings.Contains(errs, "give the PEM file of the console's certificate") {
		t.Errorf("the files swapped: exit %d, want 1 naming them and the fix; stderr:\n%s", code, errs)
	}
}

// A renewed certificate written over the files is served from the next
// connection on, without a restart.
func TestUIServesARenewedCertificateWithoutARestart(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	certFile, keyFile, first := selfSigned(t)
	p := newScheduler(t, f).with("BATCHMR_UI_TOKEN=s3cret-token-of-16+").
		start("ui", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile)
	base := consoleAt(t, p, "https")
	roots := x509.NewCertPool()
	roots.AddCert(first)
	served := func() int64 {
		t.Helper()
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}}
		resp, err := client.Get(base + "static/console.css")
		if err != nil {
			t.Fatalf("GET over TLS: %v", err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if n := served(); n != 1 {
		t.Fatalf("the console serves certificate %d, want 1", n)
	}
	roots.AddCert(writeSelfSigned(t, 2, certFile, keyFile))
	if n := served(); n != 2 {
		t.Errorf("after the files were renewed the console serves certificate %d, want 2", n)
	}
	p.interrupt(10 * time.Second)
}
