// Package app holds what batchmr's commands and the worker runtime share:
// flags with environment fallbacks, connections with clear errors, logging.
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// SemaphoreName is the semaphore of the fleet's database permits.
const SemaphoreName = "db"

// SemaphorePrefix is the prefix of the fleet's semaphores' keys under the
// deployment's prefix (Prefix, or worker.Config's).
func SemaphorePrefix(prefix string) string { return prefix + ":sem" }

// Env returns the environment variable name's value, or def.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// EnvInt is Env for an integer. A malformed value returns def and a
// *UsageError naming the variable and the fix.
func EnvInt(name string, def int) (int, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return def, Usagef("%s=%q is not a whole number: give one such as %d, or unset it for that default", name, v, def)
	}
	return n, nil
}

// EnvDuration is EnvInt for a duration.
func EnvDuration(name string, def time.Duration) (time.Duration, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return def, Usagef("%s=%q is not a duration: give one such as %v (units ms, s, m, h), or unset it for that default", name, v, def)
	}
	return d, nil
}

// EnvBool is EnvInt for a boolean (1, t, true, 0, f, false, as flags take
// them).
func EnvBool(name string, def bool) (bool, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return def, Usagef("%s=%q is not a boolean: give true or false, or unset it for %v", name, v, def)
	}
	return b, nil
}

// NewLogger returns a slog logger writing to w (a command's stderr) in
// format (text or json) the records at level (debug, info, warn or error)
// and above; both in any case. It returns an error naming the flag, its
// variable and the values allowed for anything else, such as "warning" or
// "DEBUG+2".
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	lv, ok := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo,
		"warn": slog.LevelWarn, "error": slog.LevelError}[strings.ToLower(level)]
	if !ok {
		return nil, fmt.Errorf("--log-level %q (env LOG_LEVEL): use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q (env LOG_FORMAT): use text or json", format)
}

// failoverAddr is the Addr in the options of go-redis's FailoverClient,
// whose server is the primary that the Sentinels name.
const failoverAddr = "FailoverClient"

// quiet drops go-redis's own log lines ("failed to dial after 5
// attempts"): the commands report errors themselves, in one line.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Redis connects to url, in any of RedisOptions's three forms, with the
// TLS settings t, and checks that the server answers. It returns a
// *redis.Client for a standalone or a Sentinel URL (go-redis's
// FailoverClient is one), and a *redis.ClusterClient for a Cluster URL or
// for a standalone URL whose server runs in cluster mode. A client that
// does not verify the server's certificate (t.InsecureSkipVerify) logs a
// warning on log (nil: slog.Default()). Its errors name the problem and
// the flag that fixes it, and never hold the URL's password.
func Redis(ctx context.Context, url string, t RedisTLS, log *slog.Logger) (redis.UniversalClient, error) {
	r, err := RedisOptions(url, t)
	if err != nil {
		return nil, err
	}
	return r.Connect(ctx, log)
}

// Connect connects to r and checks that it answers, as Redis does. A
// RedisStandalone target whose server runs in cluster mode (it answers
// CLUSTER INFO, or cluster_enabled:1 in INFO cluster) becomes a
// RedisCluster target seeded with that server, so that r.Server() names
// what the client reaches.
func (r *RedisTarget) Connect(ctx context.Context, log *slog.Logger) (redis.UniversalClient, error) {
	redis.SetLogger(quiet{})
	if cfg := r.tlsConfig(); cfg != nil && cfg.InsecureSkipVerify {
		if log == nil {
			log = slog.Default()
		}
		log.Warn(insecureWarning, "redis", strings.Join(r.Addrs(), ","))
	}
	rdb := r.NewClient()
	if err := r.ping(ctx, rdb); err != nil {
		rdb.Close()
		return nil, err
	}
	if r.Form == RedisStandalone && r.Simple.Network == "tcp" && clusterMode(ctx, rdb) {
		rdb.Close()
		r.asCluster()
		rdb = r.NewClient()
		if err := r.ping(ctx, rdb); err != nil {
			rdb.Close()
			return nil, err
		}
	}
	return rdb, nil
}

// sentinelError says why a Sentinel target's client found no primary
// when the Sentinels are what failed (go-redis joins their errors, one a
// line), or returns nil.
func sentinelError(r *RedisTarget, err error) error {
	const none = "all sentinels specified in configuration are unreachable"
	msg := err.Error()
	i := strings.Index(msg, none)
	if r.Form != RedisSentinel || i < 0 {
		return nil
	}
	cause, _, _ := strings.Cut(strings.TrimPrefix(msg[i+len(none):], ": "), "\n")
	at := strings.Join(r.Failover.SentinelAddrs, ", ")
	switch {
	case strings.Contains(msg, redis.Nil.Error()):
		return fmt.Errorf("the Sentinels at %s know no primary named %q: give master_name= in --redis-url (env REDIS_URL) the name of their sentinel monitor line (SENTINEL MASTERS lists them)",
			at, r.Failover.MasterName)
	case strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "NOPERM"):
		return fmt.Errorf("the Sentinels at %s refused: %s: check the user:password@ of --redis-url (env REDIS_URL), which is the Sentinels' (password= and username= are the primary's)",
			at, cause)
	}
	if tlsErr := redisTLSError("the Sentinels at "+at, r.tlsConfig(), err); tlsErr != nil {
		return tlsErr
	}
	return fmt.Errorf("cannot reach the Sentinels at %s (%s): check --redis-url (env REDIS_URL) and that they are up", at, cause)
}

// clusterMode reports whether the server of rdb runs in cluster mode.
func clusterMode(ctx context.Context, rdb redis.UniversalClient) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// CLUSTER INFO first: an ACL without @dangerous denies INFO, and
	// would log a denial (ACL LOG) at every connect.
	err := rdb.ClusterInfo(ctx).Err()
	if err == nil || strings.Contains(err.Error(), "cluster support disabled") {
		return err == nil
	}
	info, err := rdb.Info(ctx, "cluster").Result()
	return err == nil && strings.Contains(info, "cluster_enabled:1")
}

// ping checks that rdb, a client of r, gets an answer within 5s, and
// says why not and what fixes it.
func (r *RedisTarget) ping(ctx context.Context, rdb redis.UniversalClient) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := rdb.Ping(pctx).Err()
	if err == nil {
		return nil
	}
	server := r.Server()
	if sentinels := sentinelError(r, err); sentinels != nil {
		return sentinels
	}
	var answered redis.Error
	switch {
	case r.Form == RedisStandalone && errors.As(err, &answered) && strings.Contains(err.Error(), "SELECT is not allowed in cluster mode"):
		return fmt.Errorf("%s runs Redis Cluster, which has only database 0: drop /%d from --redis-url (env REDIS_URL)", server, r.Simple.DB)
	case errors.As(err, &answered) && !errors.Is(err, redis.Nil):
		// It answered: the URL's database, user or password is wrong.
		fix := "check the user, password and database number of --redis-url (env REDIS_URL)"
		if r.Form == RedisSentinel {
			fix = "check the primary's password= (and username=) and the database number of --redis-url (env REDIS_URL); its user:password@ is the Sentinels'"
		}
		return fmt.Errorf("%s refused: %w: %s", server, err, fix)
	}
	up := map[RedisForm]string{RedisStandalone: "the server is up", RedisCluster: "the Cluster's nodes are up", RedisSentinel: "the Sentinels and their primary are up"}[r.Form]
	if errors.Is(err, context.DeadlineExceeded) {
		hint := ""
		if r.tlsConfig() != nil {
			hint = "; if it takes no TLS, use a redis:// URL"
		}
		return fmt.Errorf("cannot reach %s: no answer within 5s: check --redis-url (env REDIS_URL) and that %s%s", server, up, hint)
	}
	if tlsErr := redisTLSError(server, r.tlsConfig(), err); tlsErr != nil {
		return tlsErr
	}
	return fmt.Errorf("cannot reach %s (%w): check --redis-url (env REDIS_URL) and that %s", server, err, up)
}

// Postgres connects a pool to url, naming its connections appName in
// pg_stat_activity, and checks that the server answers. configure, if not
// nil, completes the pool's configuration first (the worker's has its
// connections cancel a query on the server when the query's context is
// done, pgsource.ConfigurePool, and traces its queries).
func Postgres(ctx context.Context, url, appName string, maxConns int, configure func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("no database: pass --database-url or set DATABASE_URL (e.g. postgres://user@localhost:5432/db)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url (env DATABASE_URL): %w: give a URL such as postgres://user:password@host:5432/dbname?sslmode=verify-full&sslrootcert=ca.pem (sslmode=disable on a network you trust)", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	if configure != nil {
		configure(cfg)
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		var reply *pgconn.PgError
		if errors.As(err, &reply) {
			// It answered: a database, user or password that it refuses.
			return nil, fmt.Errorf("the Postgres server at %s:%d refused: %s (SQLSTATE %s): check the user, password and database of --database-url (env DATABASE_URL)",
				cfg.ConnConfig.Host, cfg.ConnConfig.Port, reply.Message, reply.Code)
		}
		var cert *tls.CertificateVerificationError
		switch {
		case strings.Contains(err.Error(), "server refused TLS connection"):
			// It answered, without TLS: up, but sslmode asks for TLS.
			return nil, fmt.Errorf("the Postgres server at %s:%d does not accept TLS, which the sslmode of --database-url (env DATABASE_URL) requires: "+
				"turn TLS on in the server (ssl = on), or use sslmode=disable on a network you trust", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
		case errors.As(err, &cert):
			fix := "give its CA with sslrootcert=FILE in --database-url (env DATABASE_URL)"
			var (
				host    x509.HostnameError
				invalid x509.CertificateInvalidError
			)
			switch {
			case errors.As(cert.Err, &host):
				fix = "connect by a name the certificate was issued for, in --database-url (env DATABASE_URL)"
			case errors.As(cert.Err, &invalid) && invalid.Reason == x509.Expired:
				fix = "renew the server's certificate (ssl_cert_file), or correct this host's clock if it is wrong"
			}
			return nil, fmt.Errorf("the Postgres server at %s:%d sent a certificate that did not verify (%v): %s",
				cfg.ConnConfig.Host, cfg.ConnConfig.Port, cert.Err, fix)
		}
		return nil, fmt.Errorf("cannot reach the Postgres server at %s:%d (%w): check --database-url (env DATABASE_URL) and that the server is up", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// Prefix starts every key of runs (Prefix), semaphores (Prefix:sem) and
// the catalogue, and names each job's queue (Prefix:JOB): several
// independent deployments (or test runs) share one Redis by giving each its
// own BATCHMR_PREFIX. Set but empty (an unset variable passed through by
// compose or a manifest) it is the default, as worker.Config's Prefix is:
// a command that read "" would keep its semaphores apart from the
// workers' (":sem" rather than "batchmr:sem"), silently.
var Prefix = prefixOf(os.Getenv("BATCHMR_PREFIX"))

func prefixOf(v string) string {
	if v == "" {
		return "batchmr"
	}
	return v
}

// EnvHelp documents the settings above, for every command's --help.
const EnvHelp = `
Environment: BATCHMR_PREFIX (default batchmr, also when set empty) starts every Redis key and
queue name of one deployment, so that several share one Redis; every
worker and scheduler of a deployment must agree on it.
`

// EmptyCatalogue says that no worker has announced a job where rdb and
// prefix point, naming both: a REDIS_URL with another database number, or
// another BATCHMR_PREFIX, than the workers' is the likeliest cause when
// workers do run. (The database is named when rdb is a *redis.Client,
// the Cluster's seeds when it is a *redis.ClusterClient.)
func EmptyCatalogue(rdb redis.UniversalClient, prefix string) string {
	where := ""
	switch rc := rdb.(type) {
	case *redis.Client:
		where = fmt.Sprintf(" in Redis database %d at %s", rc.Options().DB, rc.Options().Addr)
		if rc.Options().Addr == failoverAddr {
			where = fmt.Sprintf(" in Redis database %d of the Sentinels' primary", rc.Options().DB)
		}
	case *redis.ClusterClient:
		where = " in the Redis Cluster at " + strings.Join(rc.Options().Addrs, ", ")
	}
	return fmt.Sprintf("the catalogue is empty: no worker has announced a job under prefix %q%s. "+
		"Start a worker that runs your jobs; if workers do run, use the REDIS_URL (with its database number) and BATCHMR_PREFIX they use",
		prefix, where)
}

// BuildVersion is the version of batchmr this binary was built with: the
// module's version where batchmr is a dependency (v0.4.1, say), or, for a
// build inside batchmr's own repository, "devel" and the commit it was
// built from, "+dirty" if it had changes; "unknown" without build
// information.
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	const module = "github.com/batchmr/batchmr"
	v := ""
	if bi.Main.Path == module {
		v = bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == module {
			v = d.Version
			if d.Replace != nil {
				// A directory (a checkout) has no version: "devel", as
				// a build of batchmr's own commands says.
				v = d.Replace.Version
			}
		}
	}
	if v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			rev = " " + s.Value[:12]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	if bi.Main.Path != module {
		rev, dirty = "", "" // the revision is the user's module's, not batchmr's
	}
	return "devel" + rev + dirty
}

// ClockOffset measures how far this host's clock (now) is from Redis's
// TIME: positive when this host is ahead. The round trip's uncertainty is
// subtracted, so that a slow network never makes a good clock look bad.
func ClockOffset(ctx context.Context, rdb redis.Cmdable, now func() time.Time) (time.Duration, error) {
	sent := now()
	rt, err := rdb.Time(ctx).Result()
	got := now()
	if err != nil {
		return 0, err
	}
	half := got.Sub(sent) / 2
	off := sent.Add(half).Sub(rt)
	switch {
	case off > half:
		return off - half, nil
	case off < -half:
		return off + half, nil
	}
	return 0, nil
}

// RedisSkew is how far Redis's clock is ahead of this host's (negative:
// behind): ClockOffset turned round, or 0 if Redis does not answer. Add
// it to time.Now() to compare with times Redis stamped, such as a run's
// Created and Retried, whatever this host's clock says.
func RedisSkew(ctx context.Context, rdb redis.Cmdable) time.Duration {
	off, err := ClockOffset(ctx, rdb, time.Now)
	if err != nil {
		return 0
	}
	return -off
}

// JSONError says why s is not JSON, and where, or returns nil.
func JSONError(s string) error {
	if json.Valid([]byte(s)) {
		return nil // numbers past float64's range are JSON, though Unmarshal into any refuses them
	}
	var v any
	err := json.Unmarshal([]byte(s), &v)
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("%v, at byte %d", syn, syn.Offset)
	}
	return err
}

// StringList is a repeatable flag.
type StringList []string

func (s *StringList) String() string     { return strings.Join(*s, ",") }
func (s *StringList) Set(v string) error { *s = append(*s, v); return nil }

var _ flag.Value = (*StringList)(nil)
