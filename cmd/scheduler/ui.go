package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/console"
)

const uiUsage = `scheduler ui [--listen ADDR] [--read-only] [--tls-cert FILE --tls-key FILE]:
serve the web console until SIGTERM: runs with their progress (pages/s,
ETA) and failed pages, cancel and retry; the jobs of the catalogue with
their workers and next cron ticks; the semaphores with their holders,
waiters and a live chart of the last five minutes, and a form to change
their limits.

Access. It listens on loopback by default. With BATCHMR_UI_TOKEN set (16
random characters or more: openssl rand -hex 16), every page and action
needs that token: a login form (which sets a session cookie) or
"Authorization: Bearer TOKEN"; 5 wrong tokens from one address within a
minute block it for a minute. Listening beyond loopback (0.0.0.0, :8080,
a LAN address) needs the token, with --read-only too, since reading
shows every run's arguments, results and errors; only --insecure-no-auth
starts it without one, for a proxy in front that authenticates every
request. --read-only serves no mutations at all; mutations (cancel,
retry, set limit) are checked against cross-site requests.

TLS. --tls-cert and --tls-key serve HTTPS with that certificate (PEM, its
chain leaf first) and private key, read again when they change (a renewed
certificate needs no restart); the session cookie is then Secure. Beyond loopback use them, or a
TLS proxy: the token would cross the network in clear.

It answers only requests addressed to localhost or an IP address, so that
no web page can reach it through a name of its own (DNS rebinding). When
browsers reach it by a name (a reverse proxy, a DNS name), give that URL
with --public-url: its host is then served, forms from its origin are
accepted though the proxy rewrote the Host header, and with https the
login cookie is Secure.

Examples:
  scheduler ui
  scheduler ui --read-only
  BATCHMR_UI_TOKEN=$(openssl rand -hex 16) scheduler ui --listen :8443 --tls-cert console.pem --tls-key console-key.pem
  scheduler ui --listen 127.0.0.1:8080 --public-url https://batchmr.example.com   # behind a TLS proxy

Flags:
`

func ui(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve the console on (loopback by default; beyond it needs BATCHMR_UI_TOKEN)")
	readOnly := fs.Bool("read-only", false, "serve no mutations: no cancel, retry or set limit")
	insecure := fs.Bool("insecure-no-auth", false, "listen beyond loopback without BATCHMR_UI_TOKEN: only behind a proxy that authenticates every request")
	tlsCert := fs.String("tls-cert", app.Env("BATCHMR_UI_TLS_CERT", ""), "PEM file of the certificate to serve HTTPS with, its chain leaf first; needs --tls-key (env BATCHMR_UI_TLS_CERT)")
	tlsKey := fs.String("tls-key", app.Env("BATCHMR_UI_TLS_KEY", ""), "PEM file of --tls-cert's private key (env BATCHMR_UI_TLS_KEY)")
	newLogger := logFlags(fs)
	publicURL := fs.String("public-url", app.Env("BATCHMR_UI_PUBLIC_URL", ""), "the URL browsers use when it is a name, e.g. https://batchmr.example.com behind a proxy (env BATCHMR_UI_PUBLIC_URL)")
	pos, err := parse(fs, uiUsage, args, stdout)
	if err != nil {
		return err
	}
	if err := want(pos, 0, 0, ""); err != nil {
		return err
	}
	log, err := newLogger(stderr)
	if err != nil {
		return err
	}
	if *publicURL != "" {
		if err := console.CheckPublicURL(*publicURL); err != nil {
			return app.Usagef("--public-url: %v", err)
		}
	}
	tlsConf, err := uiTLS(*tlsCert, *tlsKey, log)
	if err != nil {
		return err
	}
	token := os.Getenv("BATCHMR_UI_TOKEN")
	if n := len(token); n > 0 && n < 16 {
		log.Warn("scheduler: BATCHMR_UI_TOKEN is short: it can be guessed, at 5 tries a minute per address; use 16 random characters or more, such as $(openssl rand -hex 16)", "characters", n)
	}
	ln, err := listenUI(*listen)
	if err != nil {
		return err
	}
	// Returning before it serves, the command closes it; Shutdown, after.
	defer ln.Close()
	https := tlsConf != nil || strings.HasPrefix(*publicURL, "https://")
	if err := checkReach(ln.Addr(), *listen, token, *insecure, *readOnly, https, log); err != nil {
		return err
	}
	c, err := connect(ctx, *url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	con, err := console.New(console.Config{Redis: c.rdb, MapReduce: c.mr, Prefix: app.Prefix,
		SemaphorePrefix: app.SemaphorePrefix(app.Prefix), ReadOnly: *readOnly, Token: token, PublicURL: *publicURL, Logger: log})
	if err != nil {
		return fmt.Errorf("ui: %v", err)
	}
	defer con.Close()
	go con.Sample(ctx)
	return serveConsole(ctx, con, ln, tlsConf, *publicURL, stderr, log)
}

// listenUI listens on --listen's address: a *app.UsageError for one that
// is not HOST:PORT.
func listenUI(listen string) (net.Listener, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		if _, _, serr := net.SplitHostPort(listen); serr != nil {
			return nil, app.Usagef("ui --listen %q: %v: give HOST:PORT, e.g. 127.0.0.1:8080, or :8080 for every interface", listen, serr)
		}
		return nil, fmt.Errorf("ui: %v: choose another --listen address", err)
	}
	return ln, nil
}

// checkReach refuses a console listening beyond loopback (on addr) without
// a token, unless insecure, and warns of one served without a token or in
// clear (not https).
func checkReach(addr net.Addr, listen, token string, insecure, readOnly, https bool, log *slog.Logger) error {
	if host, _, _ := net.SplitHostPort(addr.String()); isLoopback(host) {
		return nil
	}
	switch {
	case token == "" && !insecure:
		what := "read every run's arguments, results and errors, cancel runs and change limits"
		if readOnly {
			what = "read every run's arguments, results and errors"
		}
		return app.Usagef("ui --listen %s reaches beyond this host and BATCHMR_UI_TOKEN is unset: anyone who reaches it could %s. "+
			"Set BATCHMR_UI_TOKEN (for instance to $(openssl rand -hex 16)), listen on 127.0.0.1, "+
			"or, when a proxy in front authenticates every request, pass --insecure-no-auth", listen, what)
	case token == "":
		log.Warn("scheduler: the console listens beyond loopback with no BATCHMR_UI_TOKEN (--insecure-no-auth): whoever reaches it reads every run, and, without --read-only, changes things", "listen", addr.String())
	case !https:
		log.Warn("scheduler: the console listens beyond loopback over plain HTTP: the token and the session cookie cross the network in clear; give --tls-cert and --tls-key, or put a TLS proxy in front (and --public-url https://...)", "listen", addr.String())
	}
	return nil
}

// serveConsole serves con on ln, over TLS with tlsConf if not nil, until
// ctx is done, then shuts the server down within 5s.
func serveConsole(ctx context.Context, con http.Handler, ln net.Listener, tlsConf *tls.Config, publicURL string, stderr io.Writer, log *slog.Logger) error {
	// Bounded reads and idle connections: a client beyond loopback cannot
	// hold connections open by trickling bytes.
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, TLSConfig: tlsConf}
	done := make(chan error, 1)
	go func() {
		if tlsConf != nil {
			done <- srv.ServeTLS(ln, "", "")
		} else {
			done <- srv.Serve(ln)
		}
	}()
	fmt.Fprintf(stderr, "scheduler: console on %s (Ctrl-C stops it)\n", consoleURL(ln.Addr(), publicURL, tlsConf != nil))
	select {
	case err := <-done:
		return fmt.Errorf("ui: %v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("scheduler: console shutdown", "error", err)
	}
	return nil
}

// uiTLS returns the TLS configuration of --tls-cert and --tls-key, nil
// when neither is given; one without the other is a *app.UsageError.
func uiTLS(certFile, keyFile string, log *slog.Logger) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, app.Usagef("--tls-cert and --tls-key go together: give both (the PEM files of the certificate and of its private key), or neither to serve plain HTTP")
	}
	if certFile == "" {
		return nil, nil
	}
	files, err := loadCertFiles(certFile, keyFile, log)
	if err != nil {
		return nil, fmt.Errorf("ui: %v", err)
	}
	return &tls.Config{GetCertificate: files.get, MinVersion: tls.VersionTLS12}, nil
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consoleURL is the address to open for a listener (https when it serves
// TLS): the public URL when one is set; for a listener bound to every interface (0.0.0.0, or [::]
// as Go reports it), one of this host's IP addresses, which other machines
// reach and the console answers to (it refuses host names other than its
// public URL's, and "[::]" is no address a browser opens).
func consoleURL(addr net.Addr, publicURL string, tls bool) string {
	if publicURL != "" {
		return strings.TrimSuffix(publicURL, "/") + "/"
	}
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + addr.String() + "/"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = hostIP()
	}
	return scheme + net.JoinHostPort(host, port) + "/"
}

// hostIP is an address of this host that other machines may reach: its
// first global unicast IPv4 address, else IPv6, else localhost.
func hostIP() string {
	addrs, _ := net.InterfaceAddrs()
	var v6 string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || !n.IP.IsGlobalUnicast() {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP.String()
		}
		if v6 == "" {
			v6 = n.IP.String()
		}
	}
	if v6 != "" {
		return v6
	}
	return "localhost"
}
