package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/console"
)

const uiUsage = `scheduler ui [--listen ADDR] [--read-only]: serve the web console until
SIGTERM: runs with their progress (pages/s, ETA) and failed pages, cancel
and retry; the jobs of the catalogue with their workers and next cron
ticks; the semaphores with their holders, waiters and a live chart of the
last five minutes, and a form to change their limits.

It listens on loopback by default: anyone who can reach it can read every
run's errors and results. Mutations (cancel, retry, set limit) are POSTs
checked against cross-site requests; when BATCHMR_UI_TOKEN is set they
also need that token (a login form, or "Authorization: Bearer TOKEN").
--read-only serves no mutations at all. To expose the console beyond this
host, set a token and put it behind TLS.

It answers only requests addressed to localhost or an IP address, so that
no web page can reach it through a name of its own (DNS rebinding). When
browsers reach it by a name (a reverse proxy, a DNS name), give that URL
with --public-url: its host is then served, forms from its origin are
accepted though the proxy rewrote the Host header, and with https the
login cookie is Secure.

Examples:
  scheduler ui
  BATCHMR_UI_TOKEN=$(openssl rand -hex 16) scheduler ui --listen 0.0.0.0:8080
  scheduler ui --read-only
  scheduler ui --listen 127.0.0.1:8080 --public-url https://batchmr.example.com   # behind a TLS proxy

Flags:
`

func ui(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	url := redisFlag(fs)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve the console on (loopback by default)")
	readOnly := fs.Bool("read-only", false, "serve no mutations: no cancel, retry or set limit")
	logFormat := fs.String("log-format", app.Env("LOG_FORMAT", "text"), "text or json (env LOG_FORMAT)")
	logLevel := fs.String("log-level", app.Env("LOG_LEVEL", "info"), "debug, info, warn or error: the least severe records logged (env LOG_LEVEL)")
	publicURL := fs.String("public-url", app.Env("BATCHMR_UI_PUBLIC_URL", ""), "the URL browsers use when it is a name, e.g. https://batchmr.example.com behind a proxy (env BATCHMR_UI_PUBLIC_URL)")
	pos := parse(fs, uiUsage, args)
	want(pos, 0, 0, "")
	log, err := app.Logger(*logFormat, *logLevel)
	if err != nil {
		app.Usage("%v", err)
	}
	if *publicURL != "" {
		if err := console.CheckPublicURL(*publicURL); err != nil {
			app.Usage("--public-url: %v", err)
		}
	}
	token := os.Getenv("BATCHMR_UI_TOKEN")
	c := connect(ctx, *url)
	defer c.close()
	con, err := console.New(console.Config{Redis: c.rdb, MapReduce: c.mr, Prefix: app.Prefix,
		SemaphorePrefix: app.Prefix + ":sem", ReadOnly: *readOnly, Token: token, PublicURL: *publicURL, Logger: log})
	if err != nil {
		app.Fail("ui: %v", err)
	}
	defer con.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		if _, _, serr := net.SplitHostPort(*listen); serr != nil {
			app.Usage("ui --listen %q: %v: give HOST:PORT, e.g. 127.0.0.1:8080, or :8080 for every interface", *listen, serr)
		}
		app.Fail("ui: %v: choose another --listen address", err)
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !isLoopback(host) && token == "" && !*readOnly {
		log.Warn("scheduler: the console listens beyond loopback with no BATCHMR_UI_TOKEN: anyone who reaches it can cancel runs and change limits; set a token or use --read-only", "listen", ln.Addr().String())
	}
	go con.Sample(ctx)
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second, ErrorLog: nil}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(os.Stderr, "scheduler: console on %s (Ctrl-C stops it)\n", consoleURL(ln.Addr(), *publicURL))
	select {
	case err := <-done:
		app.Fail("ui: %v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("scheduler: console shutdown", "error", err)
	}
	return 0
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consoleURL is the address to open for a listener: the public URL when
// one is set; for a listener bound to every interface (0.0.0.0, or [::]
// as Go reports it), one of this host's IP addresses, which other machines
// reach and the console answers to (it refuses host names other than its
// public URL's, and "[::]" is no address a browser opens).
func consoleURL(addr net.Addr, publicURL string) string {
	if publicURL != "" {
		return strings.TrimSuffix(publicURL, "/") + "/"
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = hostIP()
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
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
