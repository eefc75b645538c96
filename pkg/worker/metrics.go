package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/metrics"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readyTimeout bounds each check of /readyz: a server that does not answer
// within it counts as down.
const readyTimeout = time.Second

// serveMetrics serves /metrics, /healthz and /readyz on ln until the
// worker stops.
func (w *running) serveMetrics(ln net.Listener, obs *metrics.Observer, mr *mapreduce.Client, sems []*semaphore.Semaphore) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		obs,
		metrics.NewFleet(mr, sems, metrics.FleetOptions{Logger: w.cfg.Logger}),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slogPrinter{w}}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		// Liveness: the process serves requests. It does not depend on
		// Redis or the database, so that an outage of either does not get
		// every worker restarted: the worker rides it out by itself.
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("GET /readyz", w.ready)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.cfg.Logger.Error("worker: the metrics server stopped", "addr", ln.Addr().String(), "error", err)
		}
	}()
	w.closes = append(w.closes, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	w.cfg.Logger.Info("worker: serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
}

// ready answers /readyz: 200 when Redis answers a PING and, for a worker
// with a database, the database answers one too, each within readyTimeout;
// 503 with a line per failed check otherwise. The checks run at once, and
// the answer comes within readyTimeout even when a server hangs: go-redis
// bounds a read by its ReadTimeout, not by the context's deadline.
func (w *running) ready(rw http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	type check struct {
		name string
		err  chan error
	}
	run := func(name string, ping func(context.Context) error) check {
		c := check{name, make(chan error, 1)}
		go func() { c.err <- ping(ctx) }()
		return c
	}
	checks := []check{run("redis", func(ctx context.Context) error { return w.rdb.Ping(ctx).Err() })}
	if w.env.DB != nil {
		checks = append(checks, run("database", w.env.DB.Ping))
	}
	var failed []string
	for _, c := range checks {
		var err error
		select {
		case err = <-c.err:
		case <-ctx.Done():
			err = fmt.Errorf("no answer within %v", readyTimeout)
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", c.name, err))
		}
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(failed) > 0 {
		rw.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(rw, "not ready:\n%s\n", strings.Join(failed, "\n"))
		return
	}
	_, _ = fmt.Fprintln(rw, "ok")
}

// slogPrinter passes promhttp's errors to the worker's logger.
type slogPrinter struct{ w *running }

func (p slogPrinter) Println(v ...any) {
	p.w.cfg.Logger.Warn("worker: serving /metrics: " + strings.TrimSuffix(fmt.Sprintln(v...), "\n"))
}
