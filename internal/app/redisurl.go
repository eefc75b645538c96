package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/redis/go-redis/v9"
)

// RedisForm is the topology a --redis-url names, in go-redis's three URL
// forms.
type RedisForm int

const (
	// RedisStandalone is one server: redis://host:port/db (rediss://,
	// unix://). A server in cluster mode makes it a RedisCluster at
	// connect (RedisTarget.Connect).
	RedisStandalone RedisForm = iota
	// RedisCluster is a Redis Cluster: redis://host:port?addr=host2:port2,
	// redis.ParseClusterURL's form (addr= adds seeds).
	RedisCluster
	// RedisSentinel is the primary that Sentinels name:
	// redis://sentinel:26379/db?master_name=NAME&addr=sentinel2:26379,
	// redis.ParseFailoverURL's form.
	RedisSentinel
)

func (f RedisForm) String() string {
	return [...]string{"standalone", "Cluster", "Sentinel"}[f]
}

// RedisTarget is a parsed --redis-url with its TLS settings applied: the
// options of one form, the others nil.
type RedisTarget struct {
	Form     RedisForm
	Simple   *redis.Options         // Form RedisStandalone
	Cluster  *redis.ClusterOptions  // Form RedisCluster
	Failover *redis.FailoverOptions // Form RedisSentinel
}

// NewClient returns a client of the target, not yet connected: a
// *redis.Client for Standalone and Sentinel (go-redis's FailoverClient is
// a *redis.Client), a *redis.ClusterClient for Cluster, which reloads its
// map of slots when a node fails (rediserr.ReloadSlotsOnErrors).
func (r *RedisTarget) NewClient() redis.UniversalClient {
	switch r.Form {
	case RedisCluster:
		c := redis.NewClusterClient(r.Cluster)
		rediserr.ReloadSlotsOnErrors(c)
		return c
	case RedisSentinel:
		return redis.NewFailoverClient(r.Failover)
	}
	return redis.NewClient(r.Simple)
}

// Addrs are the addresses the URL gives: the server's, the Cluster's
// seeds, or the Sentinels'.
func (r *RedisTarget) Addrs() []string {
	switch r.Form {
	case RedisCluster:
		return r.Cluster.Addrs
	case RedisSentinel:
		return r.Failover.SentinelAddrs
	}
	return []string{r.Simple.Addr}
}

// Server names what the target reaches, for messages: "the Redis server
// at ADDR", "the Redis Cluster at ADDR, ADDR", "the Redis primary NAME of
// the Sentinels at ADDR, ADDR".
func (r *RedisTarget) Server() string {
	addrs := strings.Join(r.Addrs(), ", ")
	switch r.Form {
	case RedisCluster:
		return "the Redis Cluster at " + addrs
	case RedisSentinel:
		return fmt.Sprintf("the Redis primary %q of the Sentinels at %s", r.Failover.MasterName, addrs)
	}
	return "the Redis server at " + addrs
}

func (r *RedisTarget) tlsConfig() *tls.Config {
	switch r.Form {
	case RedisCluster:
		return r.Cluster.TLSConfig
	case RedisSentinel:
		return r.Failover.TLSConfig
	}
	return r.Simple.TLSConfig
}

// asCluster turns a Standalone target whose server runs in cluster mode
// into a Cluster target seeded with that server, with the same
// credentials, TLS and pool settings.
func (r *RedisTarget) asCluster() {
	o := r.Simple
	r.Form, r.Simple = RedisCluster, nil
	r.Cluster = &redis.ClusterOptions{
		Addrs: []string{o.Addr}, ClientName: o.ClientName, Protocol: o.Protocol,
		Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
		MaxConcurrentDials: o.MaxConcurrentDials,
		PipelinePoolSize:   o.PipelinePoolSize, PipelineReadBufferSize: o.PipelineReadBufferSize, PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime, ConnMaxLifetimeJitter: o.ConnMaxLifetimeJitter,
	}
}

// The three forms, for errors that show them.
const (
	standaloneForm = "redis://[user:password@]host:port/db, e.g. redis://localhost:6379/0 (rediss:// for TLS, unix:///path/redis.sock for a socket)"
	clusterForm    = "redis://[user:password@]host:port?addr=host2:port2&addr=host3:port3 (rediss:// for TLS)"
	sentinelForm   = "redis://[user:password@]sentinel:26379/db?master_name=NAME&addr=sentinel2:26379 (user:password@ is the Sentinels'; password= and username= the primary's)"
)

// RedisOptions parses rawURL, in one of go-redis's three forms, and
// applies t to its TLS configuration: every command and the worker build
// their Redis connections here. master_name= makes it a Sentinel URL
// (addr= then adds Sentinels), addr= without it a Cluster URL, neither a
// standalone URL (redis://, rediss:// or unix://). It returns an error
// that names the form, the flag and the fix when rawURL is empty or does
// not parse (with the password, if any, replaced by xxxxx), when a
// Cluster URL has a database other than 0, when a file of t cannot be
// read, when t is set for a URL without TLS, or when the URL asks for
// skip_verify=true without t.InsecureSkipVerify.
func RedisOptions(rawURL string, t RedisTLS) (*RedisTarget, error) {
	if rawURL == "" {
		return nil, errors.New("no Redis: pass --redis-url or set REDIS_URL (e.g. redis://localhost:6379/0)")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("--redis-url (env REDIS_URL) %s: %s: give it as %s", Redact(rawURL), urlCause(err, rawURL), standaloneForm)
	}
	bad := func(form string, err error) error {
		return fmt.Errorf("--redis-url (env REDIS_URL) %s: %w: give it as %s", Redact(rawURL), err, form)
	}
	q := u.Query()
	r := &RedisTarget{}
	var parsed *tls.Config
	switch {
	case q.Has("master_name"):
		r.Form = RedisSentinel
		if r.Failover, err = redis.ParseFailoverURL(rawURL); err != nil {
			return nil, bad(sentinelForm, err)
		}
		if r.Failover.MasterName == "" {
			return nil, bad(sentinelForm, errors.New("master_name= is empty"))
		}
		parsed = r.Failover.TLSConfig
	case q.Has("addr"):
		r.Form = RedisCluster
		if u.Scheme == "unix" {
			return nil, bad(clusterForm, errors.New("a Cluster URL is redis:// or rediss://, not unix://"))
		}
		// go-redis would ignore a database: say that a Cluster has only 0.
		db := strings.Trim(u.Path, "/")
		if q.Has("db") {
			db = q.Get("db")
		}
		if db != "" && db != "0" {
			return nil, bad(clusterForm, fmt.Errorf("a Redis Cluster has only database 0, and this Cluster URL asks for database %s", db))
		}
		// go-redis's Cluster URL takes no skip_verify: it is applied here,
		// as for the other two forms.
		skip, err := skipVerify(q)
		if err != nil {
			return nil, bad(clusterForm, err)
		}
		q.Del("db")
		q.Del("skip_verify")
		u.Path, u.RawPath, u.RawQuery = "", "", q.Encode()
		if r.Cluster, err = redis.ParseClusterURL(u.String()); err != nil {
			return nil, bad(clusterForm, err)
		}
		if r.Cluster.TLSConfig != nil {
			r.Cluster.TLSConfig.MinVersion = tls.VersionTLS12
			r.Cluster.TLSConfig.InsecureSkipVerify = skip
		} else if skip {
			return nil, bad(clusterForm, errors.New("redis: unexpected option: skip_verify (it is for rediss:// URLs)"))
		}
		parsed = r.Cluster.TLSConfig
	default:
		if r.Simple, err = redis.ParseURL(rawURL); err != nil {
			return nil, bad(standaloneForm, err)
		}
		parsed = r.Simple.TLSConfig
	}
	cfg, err := t.apply(parsed, rawURL)
	if err != nil {
		return nil, err
	}
	switch r.Form {
	case RedisStandalone:
		r.Simple.TLSConfig = cfg
	case RedisCluster:
		r.Cluster.TLSConfig = cfg
	case RedisSentinel:
		r.Failover.TLSConfig = cfg
	}
	return r, nil
}

// skipVerify reads a URL's skip_verify= as go-redis does.
func skipVerify(q url.Values) (bool, error) {
	if !q.Has("skip_verify") {
		return false, nil
	}
	switch v := q.Get("skip_verify"); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, fmt.Errorf("redis: invalid skip_verify boolean: expected true/false/1/0 or an empty string, got %q", v)
	}
}
