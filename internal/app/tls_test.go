package app_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// mTLS is the settings of a client that trusts the test's CA and presents
// its client certificate.
func mTLS(certs *testenv.TLSCerts) app.RedisTLS {
	return app.RedisTLS{CAFile: certs.CA, CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}
}

func TestRedisOverTLSWithAPrivateCAAndAClientCertificateAnswers(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	srv := testenv.PrivateRedisTLS(t, certs, certs.Server)
	for _, u := range []string{srv.URL, strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)} {
		rdb, err := app.Redis(context.Background(), u, mTLS(certs), nil)
		if err != nil {
			t.Fatalf("%s with the CA and a client certificate: %v", u, err)
		}
		if err := rdb.Set(context.Background(), testenv.Prefix(t)+":k", "v", 0).Err(); err != nil {
			t.Errorf("SET over TLS: %v", err)
		}
		rdb.Close()
	}
}

// A TLS configuration given in memory (worker.Config.RedisTLSConfig)
// is used, with the files added to it, and the URL's host as its name.
func TestRedisTLSStartsFromAGivenConfigurationAndAddsTheFiles(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	srv := testenv.PrivateRedisTLS(t, certs, certs.Server)
	client, err := tls.LoadX509KeyPair(certs.Client.Cert, certs.Client.Key)
	if err != nil {
		t.Fatal(err)
	}
	given := &tls.Config{Certificates: []tls.Certificate{client}}
	rdb, err := app.Redis(context.Background(), srv.URL, app.RedisTLS{CAFile: certs.CA, Config: given}, nil)
	if err != nil {
		t.Fatalf("a client certificate in memory and --redis-ca-file: %v", err)
	}
	rdb.Close()
	if given.RootCAs != nil || given.ServerName != "" {
		t.Errorf("the given configuration was changed: %+v; want it cloned", given)
	}
	if _, err := app.Redis(context.Background(), srv.URL, app.RedisTLS{Config: given}, nil); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("without the CA: %v; want the unknown authority named", err)
	}
}

// Each way a TLS connection fails says why, and names the flag (or the
// server's setting) that fixes it, in one error.
func TestRedisTLSFailuresNameTheirCauseAndTheFlagThatFixesIt(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	good := testenv.PrivateRedisTLS(t, certs, certs.Server)
	expired := testenv.PrivateRedisTLS(t, certs, certs.Expired)
	wrongName := testenv.PrivateRedisTLS(t, certs, certs.WrongName)
	tls12 := testenv.PrivateRedisTLS(t, certs, certs.Server, "--tls-protocols", "TLSv1.2")
	plainAddr, err := url.Parse(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		url  string
		tls  app.RedisTLS
		want []string
	}{
		{"the system's CAs only", good.URL, app.RedisTLS{CertFile: certs.Client.Cert, KeyFile: certs.Client.Key},
			[]string{"signed by an unknown authority", "--redis-ca-file (env REDIS_CA_FILE)"}},
		{"another CA", good.URL, app.RedisTLS{CAFile: certs.OtherCA, CertFile: certs.Client.Cert, KeyFile: certs.Client.Key},
			[]string{"signed by an unknown authority", "--redis-ca-file (env REDIS_CA_FILE)"}},
		{"no client certificate", good.URL, app.RedisTLS{CAFile: certs.CA},
			[]string{"requires a client certificate", "--redis-cert-file and --redis-key-file"}},
		{"no client certificate, over TLS 1.2", tls12.URL, app.RedisTLS{CAFile: certs.CA},
			[]string{"requires a client certificate", "--redis-cert-file and --redis-key-file"}},
		{"a client certificate of another CA", good.URL, app.RedisTLS{CAFile: certs.CA, CertFile: certs.OtherClient.Cert, KeyFile: certs.OtherClient.Key},
			[]string{"refused this client's certificate", "--redis-cert-file (env REDIS_CERT_FILE) a valid certificate signed by a CA the server trusts"}},
		{"a client certificate of another CA, over TLS 1.2", tls12.URL, app.RedisTLS{CAFile: certs.CA, CertFile: certs.OtherClient.Cert, KeyFile: certs.OtherClient.Key},
			[]string{"refused this client's certificate"}},
		{"an expired server certificate", expired.URL, mTLS(certs),
			[]string{"has expired or is not valid yet", "renew the server's certificate"}},
		{"a certificate for another name", strings.Replace(wrongName.URL, "127.0.0.1", "localhost", 1), mTLS(certs),
			[]string{"a certificate for another name", "wrong.example", "connect by a name the certificate was issued for in --redis-url"}},
		{"rediss:// to a server without TLS", "rediss://" + plainAddr.Host + "/0", mTLS(certs),
			// Redis answers a TLS hello only if its bytes hold a newline.
			[]string{"use a redis:// URL"}},
		{"redis:// to a server with TLS only", strings.Replace(good.URL, "rediss://", "redis://", 1), app.RedisTLS{},
			[]string{"closed the connection", "use a rediss:// URL"}},
	} {
		_, err := app.Redis(context.Background(), tc.url, tc.tls, nil)
		if err == nil {
			t.Errorf("%s: connected; want an error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want it to say %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "cannot reach") && !strings.HasPrefix(tc.name, "rediss:// to a server without TLS") {
			t.Errorf("%s: %v; the server answered, it is not out of reach", tc.name, err)
		}
	}
}

// skip_verify=true in a URL turns verification off silently in go-redis:
// here it is refused unless --redis-insecure-skip-verify says so too, and
// then a warning is logged.
func TestSkipVerifyIsRefusedUnlessSpelledOutAndThenWarned(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	srv := testenv.PrivateRedisTLS(t, certs, certs.WrongName)
	client := app.RedisTLS{CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}
	var logs testenv.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	_, err := app.Redis(context.Background(), srv.URL+"?skip_verify=true", client, log)
	if err == nil || !strings.Contains(err.Error(), "skip_verify=true") || !strings.Contains(err.Error(), "--redis-insecure-skip-verify") {
		t.Errorf("skip_verify=true alone: %v; want it refused, naming --redis-insecure-skip-verify", err)
	}
	if logs.String() != "" {
		t.Errorf("a refused connection logged %q", logs.String())
	}

	client.InsecureSkipVerify = true
	for _, u := range []string{srv.URL + "?skip_verify=true", srv.URL} {
		rdb, err := app.Redis(context.Background(), u, client, log)
		if err != nil {
			t.Fatalf("%s with --redis-insecure-skip-verify: %v", u, err)
		}
		rdb.Close()
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"Redis's certificate is not verified (--redis-insecure-skip-verify)"); n != 2 {
		t.Errorf("logged %q; want a warning per connection made without verifying", logs.String())
	}
}

// TLS settings on a URL without TLS would be ignored: they are refused.
func TestRedisTLSSettingsOnAURLWithoutTLSAreRefused(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	_, err := app.RedisOptions("redis://localhost:6379/0", app.RedisTLS{CAFile: certs.CA})
	if err == nil || !strings.Contains(err.Error(), "has no TLS, yet --redis-ca-file is set: use a rediss:// URL") {
		t.Errorf("--redis-ca-file with redis://: %v; want it refused, naming rediss://", err)
	}
	for _, tc := range []struct {
		tls  app.RedisTLS
		want string
	}{
		{app.RedisTLS{CAFile: "/nonexistent/ca.pem"}, "--redis-ca-file (env REDIS_CA_FILE): open /nonexistent/ca.pem: no such file or directory: give the PEM file of the CA"},
		{app.RedisTLS{CAFile: certs.Client.Key}, "holds no PEM certificate"},
		{app.RedisTLS{CertFile: certs.Client.Cert}, "--redis-cert-file (env REDIS_CERT_FILE) without --redis-key-file"},
		{app.RedisTLS{KeyFile: certs.Client.Key}, "--redis-key-file (env REDIS_KEY_FILE) without --redis-cert-file"},
		{app.RedisTLS{CertFile: certs.Client.Cert, KeyFile: certs.Server.Key}, "give the PEM files of this client's certificate and of its key"},
	} {
		if _, err := app.RedisOptions("rediss://localhost:6379/0", tc.tls); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.tls, err, tc.want)
		}
	}
}

// No error holds a URL's password: a malformed URL is shown with
// xxxxx in its place, as pgx shows a Postgres URL.
func TestNoConnectionErrorHoldsThePassword(t *testing.T) {
	t.Parallel()
	const pw = "Sekr1tPW"
	ctx := context.Background()
	for _, tc := range []struct{ url, want string }{
		{"redis://admin:" + pw + "@localhost:63x9/0", `redis://admin:xxxxx@localhost:63x9/0: invalid port ":63x9" after host`},
		{"rediss://admin:" + pw + "@localhost:6379/0?skip_verify=true", "skip_verify=true"},
		{"redis://admin:" + pw + "@localhost:6379/x", `redis://admin:xxxxx@localhost:6379/x: redis: invalid database number: "x"`},
		{"redis://admin:" + pw + "@localhost:6379/0?bogus=1", "unexpected option: bogus"},
		{"redis://:" + pw + "%zz@localhost:6379/0", "the password has a character that a URL must percent-encode"},
		{"redis://admin:" + pw + "@127.0.0.1:1/0", "cannot reach the Redis server at 127.0.0.1:1"},
	} {
		_, err := app.Redis(ctx, tc.url, app.RedisTLS{}, nil)
		if err == nil || strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("REDIS_URL=%s: %v; want %q, and no password", tc.url, err, tc.want)
		}
	}
	for _, u := range []string{
		"postgres://admin:" + pw + "@localhost:54x2/db",
		"postgres://admin:" + pw + "@127.0.0.1:1/db?connect_timeout=2",
		"postgres://admin:" + pw + "@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nonexistent",
	} {
		if _, err := app.Postgres(ctx, u, "app-test", 1, nil); err == nil || strings.Contains(err.Error(), pw) {
			t.Errorf("DATABASE_URL=%s: %v; want an error without the password", u, err)
		}
	}
	// A server that refuses the password does not repeat it.
	srv := testenv.PrivateRedisServer(t, "--user", "admin", "on", ">the-right-one", "~*", "+@all")
	bad := "unix://admin:" + pw + "@" + srv.Socket
	if _, err := app.Redis(ctx, bad, app.RedisTLS{}, nil); err == nil || strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a wrong password: %v; want a refusal without the password", err)
	}
}

// Postgres over TLS with verify-full and the test's CA connects, over
// TLS; with another CA, the error names the cause and sslrootcert.
func TestPostgresVerifyFullWithAPrivateCAConnectsAndAWrongCAFailsWithItsFix(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	pg := testenv.PrivatePostgres(t, testenv.PostgresTLS(t, certs.Server)...)
	ctx := context.Background()
	verifyFull := func(ca string) string {
		return strings.Replace(pg.URL, "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(ca), 1)
	}
	pool, err := app.Postgres(ctx, verifyFull(certs.CA), "app-test", 1, nil)
	if err != nil {
		t.Fatalf("verify-full with the server's CA: %v", err)
	}
	var ssl bool
	if err := pool.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Errorf("the connection's pg_stat_ssl.ssl: %v, %v; want true", ssl, err)
	}
	pool.Close()

	_, err = app.Postgres(ctx, verifyFull(certs.OtherCA), "app-test", 1, nil)
	if err == nil || !strings.Contains(err.Error(), "unknown authority") || !strings.Contains(err.Error(), "sslrootcert=FILE") {
		t.Errorf("verify-full with another CA: %v; want the unknown authority named, and sslrootcert", err)
	}
}

// A Postgres server's expired certificate, or one for another name, is
// named with its fix; sslmode=require against a server without TLS names
// the server's setting.
func TestPostgresTLSFailuresNameTheirFix(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		pair testenv.CertPair
		want string
	}{
		{"an expired certificate", certs.Expired, "renew the server's certificate (ssl_cert_file)"},
		{"a certificate for another name", certs.WrongName, "connect by a name the certificate was issued for"},
	} {
		pg := testenv.PrivatePostgres(t, testenv.PostgresTLS(t, tc.pair)...)
		u := strings.Replace(pg.URL, "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(certs.CA), 1)
		if _, err := app.Postgres(ctx, u, "app-test", 1, nil); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "cannot reach") {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
}

// A Postgres URL to another host that can fall back to no TLS (no
// sslmode: pgx's prefer) is warned of; one that always or never uses TLS,
// or stays on this host, is not.
func TestPostgresURLsThatMayConnectWithoutTLSAreWarnedOf(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for u, want := range map[string]string{
		"postgres://app@db.example.com/shop":                                   "no sslmode, which pgx reads as prefer",
		"postgres://app@db.example.com/shop?sslmode=prefer":                    "an sslmode (prefer or allow) that falls back to no TLS",
		"postgres://app@10.0.0.5/shop?sslmode=allow":                           "an sslmode (prefer or allow)",
		"host=db.example.com user=app dbname=shop":                             "no sslmode",
		"postgres://app@db.example.com/shop?sslmode=verify-full":               "",
		"postgres://app@db.example.com/shop?sslmode=require":                   "",
		"postgres://app@db.example.com/shop?sslmode=disable":                   "",
		"postgres://app@localhost/shop":                                        "",
		"postgres://app@127.0.0.1:5432/shop":                                   "",
		"postgres://app@[::1]:5432/shop":                                       "",
		"postgres://app@/shop?host=/var/run/postgresql":                        "",
		"postgres://app@db.example.com/shop?sslmode=verify-full&sslrootcert=x": "",
	} {
		got := app.PostgresTLSWarning(u)
		if want == "" && got != "" || want != "" && (!strings.Contains(got, want) || !strings.Contains(got, "sslmode=verify-full&sslrootcert=FILE")) {
			t.Errorf("PostgresTLSWarning(%s) = %q; want %q", u, got, want)
		}
	}
}
