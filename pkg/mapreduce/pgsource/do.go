package pgsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// releaseTimeout bounds giving a permit back once its context is done, as
// semaphore.Do does.
const releaseTimeout = 5 * time.Second

// cancelDeadline is how long a connection of a ConfigurePool pool waits
// for the server to answer a cancel request before pgx closes it; the
// query is then made sure of from another connection, as for a pool that
// closes at once.
const cancelDeadline = 5 * time.Second

// checkerName is the application_name of the connections that make sure
// a cancelled query ended: they are not the worker's own queries.
const checkerName = "batchmr-pgsource-check"

// Do runs fn on one connection of db while holding a permit of sem, and
// gives the permit back only once fn's queries are gone from the server.
// fn gets the Permit's context, done when ctx is, when the lease is lost
// (cause semaphore.ErrLeaseLost) or when sem is closed; pass it to every
// query. The connection is fn's until it returns; fn must not keep it.
// Run fn's queries on it: a Do (or Fetch, Exec, Split) of the same sem
// called with fn's context returns a *NestedError at once rather than wait
// for a second permit while holding one.
//
// A pgx query returns as soon as its context is done, while the server may
// still be running it, and the next holder's query would then run beside
// it. So when fn returns with the connection broken or still busy (the
// query was abandoned, as pgx does with a pool of its defaults), Do asks
// Postgres on a connection of its own whether that connection's backend
// still runs a query, cancels it if it does (pg_cancel_backend), and waits
// until it no longer does before the permit goes back. A pool set up by
// ConfigurePool cancels on the server instead, so this check is rare. If
// the server cannot be reached at all, Do logs a warning and gives the
// permit back at once: a query cannot run on a server that
// is down. If it stays unreachable otherwise (a cut network), Do tries for
// up to the permit's lease (see settle) and then gives it back, logging
// that the query may still run. It logs to mapreduce.Logger(ctx): in a
// job's Split, Map or Reduce, the worker's logger with the step's run,
// job, page and attempt.
//
// Do reports fn's error with the permit (semaphore.Permit.Report), for the
// semaphore's controller in auto mode.
//
// Do returns fn's error, with ctx's cause when ctx ended the call, joined
// with the release's error (errors.Is(err, semaphore.ErrLeaseLost): the
// query may have run without the permit). If ctx is done before the
// permit is granted, or by the time it is, fn does not run: Do returns an
// error wrapping ctx.Err(). A nil sem means no permit, and nothing to wait
// for: fn runs on a connection of db.
func Do(ctx context.Context, db *pgxpool.Pool, sem *semaphore.Semaphore, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	if sem == nil {
		conn, err := db.Acquire(ctx)
		if err != nil {
			return fromDatabase(err)
		}
		defer conn.Release()
		return fromDatabase(fn(ctx, conn.Conn()))
	}
	if semaphore.Holding(ctx, sem) {
		return fmt.Errorf("pgsource: %w: run the query on the connection that the enclosing Do gave its function; "+
			"a second permit waits for one that callers like this one hold, for ever once they hold them all", &NestedError{Semaphore: sem.Name()})
	}
	p, err := sem.Acquire(ctx)
	if err != nil {
		return err
	}
	pctx := p.Context()
	if pctx.Err() == nil {
		err = fromDatabase(onOneConn(pctx, mapreduce.Logger(ctx).With("semaphore", sem.Name()), db, sem.Lease(), fn))
		if err != nil && pctx.Err() != nil && !errors.Is(err, pctx.Err()) {
			// A cancel on the server reads as a query error
			// (SQLSTATE 57014): say why the query was cancelled.
			err = fmt.Errorf("%w (%w)", err, context.Cause(pctx))
		}
	} else {
		// Granted as ctx ended (the grant and the cancel raced), or lost at
		// once: fn never starts its query.
		err = fmt.Errorf("permit granted too late: %w", ctx.Err())
		if ctx.Err() == nil {
			err = fmt.Errorf("permit lost at once: %w", context.Cause(pctx))
		}
	}
	p.Report(err)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return errors.Join(err, p.Release(rctx))
}

// fromDatabase marks err, from a query or a connection of the pool, as the
// database's when it is transient: a broken connection's error may not
// say it was Postgres's (a bare "unexpected EOF"), and a worker logs a
// database outage once, not per page. Other errors are left as they are,
// so that a caller comparing them with == still finds its own.
func fromDatabase(err error) error {
	if mapreduce.IsTransient(err) {
		return outage.Mark(err, outage.Database)
	}
	return err
}

// NestedError is Do's error (and that of the functions built on it) when
// called with a context that holds a permit of the same semaphore
// (semaphore.Holding: the context an enclosing Do or Semaphore.Do gave its
// function): it would wait for a second permit while holding one.
type NestedError struct {
	Semaphore string // the semaphore's name
}

func (e *NestedError) Error() string {
	return fmt.Sprintf("already holding a permit of semaphore %q in this context (pgsource.Do, Fetch, Exec or Split inside the function of a Do of the same semaphore)", e.Semaphore)
}

// onOneConn runs fn on a connection of db and returns the connection to
// the pool only once no query of fn's may still run on the server (its
// connection is returned first so that closing the pool waits for that),
// logging to log when it cannot make sure.
func onOneConn(ctx context.Context, log *slog.Logger, db *pgxpool.Pool, bound time.Duration, fn func(context.Context, *pgx.Conn) error) error {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer func() { // also on a panic in fn
		// Alive and idle, the connection says that the server sent
		// ReadyForQuery: every query of fn is over. Closed (pgx gave up on
		// it, the network failed) or busy (fn returned with rows unread),
		// it says nothing of the backend, which may still be at work.
		c := conn.Conn()
		if !c.IsClosed() && c.PgConn().IsBusy() {
			// A backend blocked sending rows nobody reads does not act on a
			// cancel until it can send again; once the connection is
			// closed, it cannot, and ends.
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.Close(cctx)
			cancel()
		}
		if c.IsClosed() {
			settle(log, db.Config().ConnConfig, c.PgConn().PID(), bound)
		}
		conn.Release()
	}()
	return fn(ctx, conn.Conn())
}

// settle returns once the backend pid no longer runs a query: it asks
// pg_stat_activity on a connection of its own, and cancels the query while
// it still runs.
//
// It gives up, with a warning on log, when the server refuses connections (it is
// down, and a query cannot run on a server that is down), and after bound
// when the server cannot be reached otherwise: a cut network or an
// unresponsive server, where the query may still run. bound is the permit's
// lease, because that is what the fleet already trusts for a holder it
// cannot hear from: a crashed worker's permit, whose queries may still run
// just the same, comes back after one lease. Holding on longer would take
// a permit from the fleet for as long as the network stays cut.
func settle(log *slog.Logger, cfg *pgx.ConnConfig, pid uint32, bound time.Duration) {
	deadline := time.Now().Add(bound)
	cfg = cfg.Copy()
	cfg.RuntimeParams["application_name"] = checkerName
	cfg.Tracer = nil // its checks are no query of the worker's
	backoff := 10 * time.Millisecond
	var err error
	for {
		var ok bool
		if ok, err = ended(cfg, pid, deadline); ok {
			return
		}
		if isRefused(err) {
			log.Warn("pgsource: Postgres refuses connections, so a cancelled query cannot still run there: giving its permit back",
				"pid", pid, "error", err)
			return
		}
		if time.Until(deadline) < backoff {
			log.Warn("pgsource: could not make sure a cancelled query ended on the server within the permit's lease: giving the permit back, the query may still run",
				"pid", pid, "lease", bound, "error", err)
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// ended connects with cfg and watches backend pid until it runs no query
// (ok), cancelling the query every 100ms while it does, or until an error
// or the deadline.
func ended(cfg *pgx.ConnConfig, pid uint32, deadline time.Time) (ok bool, err error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var cancelled time.Time
	wait := 2 * time.Millisecond
	for {
		var state *string
		err := conn.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return true, nil // the backend exited
		case err != nil:
			return false, err
		}
		switch s := deref(state); s {
		case "active", "fastpath function call":
		case "disabled", "":
			// track_activities is off (or, for another role, the state is
			// hidden): there is no telling, so cancel once and trust it.
			_, err := conn.Exec(ctx, "SELECT pg_cancel_backend($1)", int32(pid))
			return err == nil, err
		default:
			return true, nil // idle, or idle in a transaction: no query
		}
		if time.Since(cancelled) >= 100*time.Millisecond {
			if _, err := conn.Exec(ctx, "SELECT pg_cancel_backend($1)", int32(pid)); err != nil {
				return false, err
			}
			cancelled = time.Now()
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("backend %d still runs a query: %w", pid, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// isRefused reports whether err means nothing listens at the server's
// address: the server is down, not merely out of reach.
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) // ENOENT: a Unix socket that is gone
}

// ConfigurePool makes the connections of a pool built from cfg cancel a
// query on the server when its context is done, and keep the connection,
// rather than close it and leave the query running until a cancel sent
// later lands. Do and the functions built on it are correct either way;
// with this they give a cancelled query's permit back without an extra
// connection to check on it. A worker's pool is set up so.
func ConfigurePool(cfg *pgxpool.Config) {
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &cancelHandler{conn: c}
	}
}

// cancelRepeat is how soon a connection whose context is done asks the
// server again to cancel its query, doubling up to a second between
// requests until the query returns: a backend blocked sending rows
// nobody reads ignores them, and a fleet-wide cancel should not become a
// storm of connections to the server.
const cancelRepeat = 200 * time.Millisecond

// cancelSettle is how long a cancel request may take to reach its backend
// once sent: the connection is not used again before that, so that a late
// cancel cannot end its next query. pgx waits as long.
const cancelSettle = 100 * time.Millisecond

// cancelHandler is pgx's CancelRequestContextWatcherHandler, but sending
// the cancel request again (cancelRepeat, doubling) until the query
// returns, not once. Postgres ignores a cancel that reaches a backend
// still reading the query from its connection, so a single request sent
// as the query goes out can be lost: on a loaded machine the query then
// ran on, holding its connection and its permit for cancelDeadline, until
// pgx closed the connection.
type cancelHandler struct {
	conn *pgconn.PgConn
	stop context.CancelFunc
	done chan struct{}
}

func (h *cancelHandler) HandleCancel(context.Context) {
	deadline := time.Now().Add(cancelDeadline)
	_ = h.conn.Conn().SetDeadline(deadline)
	ctx, stop := context.WithDeadline(context.Background(), deadline)
	h.stop, h.done = stop, make(chan struct{})
	go func() {
		defer close(h.done)
		for wait := cancelRepeat; ; wait = min(2*wait, time.Second) {
			_ = h.conn.CancelRequest(ctx)
			sent := time.Now()
			select {
			case <-ctx.Done():
				time.Sleep(cancelSettle - time.Since(sent))
				return
			case <-time.After(wait):
			}
		}
	}()
}

func (h *cancelHandler) HandleUnwatchAfterCancel() {
	h.stop()
	<-h.done
	_ = h.conn.Conn().SetDeadline(time.Time{})
}
