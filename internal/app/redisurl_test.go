package app_test

import (
	"context"
	"crypto/tls"
	"slices"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/redis/go-redis/v9"
)

// master_name= makes a Sentinel URL, addr= without it a Cluster URL,
// neither a standalone URL; each keeps what go-redis reads from it.
func TestRedisURLFormIsSentinelWithMasterNameClusterWithAddrElseStandalone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url   string
		form  app.RedisForm
		addrs []string
		check func(*app.RedisTarget) bool
	}{
		{"redis://:pw@h1:6380/2", app.RedisStandalone, []string{"h1:6380"},
			func(r *app.RedisTarget) bool { return r.Simple.DB == 2 && r.Simple.Password == "pw" }},
		{"unix:///run/redis.sock?db=3", app.RedisStandalone, []string{"/run/redis.sock"},
			func(r *app.RedisTarget) bool { return r.Simple.Network == "unix" && r.Simple.DB == 3 }},
		{"redis://u:pw@h1:7000?addr=h2:7001&addr=h3:7002", app.RedisCluster, []string{"h1:7000", "h2:7001", "h3:7002"},
			func(r *app.RedisTarget) bool { return r.Cluster.Username == "u" && r.Cluster.Password == "pw" }},
		{"redis://h1:7000/0?addr=h2:7001", app.RedisCluster, []string{"h1:7000", "h2:7001"}, nil},
		{"redis://:spw@s1:26379/1?master_name=main&addr=s2:26379&addr=s3:26379&password=pw", app.RedisSentinel, []string{"s1:26379", "s2:26379", "s3:26379"},
			func(r *app.RedisTarget) bool {
				f := r.Failover
				return f.MasterName == "main" && f.DB == 1 && f.SentinelPassword == "spw" && f.Password == "pw"
			}},
	} {
		r, err := app.RedisOptions(tc.url, app.RedisTLS{})
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if r.Form != tc.form || !slices.Equal(r.Addrs(), tc.addrs) || tc.check != nil && !tc.check(r) {
			t.Errorf("%s: a %v target at %v (%+v %+v %+v); want %v at %v", tc.url, r.Form, r.Addrs(), r.Simple, r.Cluster, r.Failover, tc.form, tc.addrs)
		}
	}
}

// A Cluster has only database 0: a Cluster URL that asks for another is
// refused, saying so, rather than silently given database 0.
func TestAClusterURLWithADatabaseIsRefused(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"redis://h1:7000/3?addr=h2:7001", "redis://h1:7000?addr=h2:7001&db=2"} {
		_, err := app.RedisOptions(u, app.RedisTLS{})
		if err == nil || !strings.Contains(err.Error(), "a Redis Cluster has only database 0") || !strings.Contains(err.Error(), "redis://[user:password@]host:port?addr=host2:port2") {
			t.Errorf("%s: %v; want it refused, naming the Cluster URL's form", u, err)
		}
	}
}

// A URL that does not parse is shown without its password, with the form
// it was taken for and that form's example.
func TestARedisURLThatDoesNotParseNamesItsFormWithoutThePassword(t *testing.T) {
	t.Parallel()
	const pw = "Sekr1tPW"
	for _, tc := range []struct{ url, want string }{
		{"redis://:" + pw + "@h1:7000?addr=h2", "unable to parse addr param: h2: give it as redis://[user:password@]host:port?addr=host2:port2"},
		{"unix://:" + pw + "@/run/redis.sock?addr=h2:7001", "a Cluster URL is redis:// or rediss://, not unix://"},
		{"redis://:" + pw + "@s1:26379/0?master_name=", "master_name= is empty: give it as redis://[user:password@]sentinel:26379/db?master_name=NAME"},
		{"unix://:" + pw + "@/run/redis.sock?master_name=main", "invalid URL scheme: unix: give it as redis://[user:password@]sentinel:26379/db?master_name=NAME"},
		{"redis://:" + pw + "@s1:26379/0?master_name=main&password=" + pw + "&bogus=1", "unexpected option: bogus"},
	} {
		_, err := app.RedisOptions(tc.url, app.RedisTLS{})
		if err == nil || strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q, without the password", tc.url, err, tc.want)
		}
	}
}

// The TLS flags apply to all three forms: rediss:// turns TLS on, the CA
// file is trusted and the client certificate sent, skip_verify=true needs
// --redis-insecure-skip-verify, and TLS settings on a URL without TLS are
// refused.
func TestTheRedisTLSSettingsApplyToEveryForm(t *testing.T) {
	t.Parallel()
	certs := testenv.TLSCertificates(t)
	files := app.RedisTLS{CAFile: certs.CA, CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}
	for _, u := range []string{"rediss://h1:6380/0", "rediss://h1:7000?addr=h2:7001", "rediss://s1:26379/0?master_name=main&addr=s2:26379"} {
		r, err := app.RedisOptions(u, files)
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		cfg := tlsOf(r)
		if cfg == nil || cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.InsecureSkipVerify || cfg.MinVersion < tls.VersionTLS12 {
			t.Errorf("%s: TLS %+v; want the CA file trusted, the client certificate, verification, TLS 1.2 at least", u, cfg)
		}
		skip := u + "&skip_verify=true"
		if !strings.Contains(u, "?") {
			skip = u + "?skip_verify=true"
		}
		_, err = app.RedisOptions(skip, app.RedisTLS{})
		if err == nil || !strings.Contains(err.Error(), "add --redis-insecure-skip-verify") {
			t.Errorf("%s: %v; want it refused without --redis-insecure-skip-verify", skip, err)
		}
		r, err = app.RedisOptions(skip, app.RedisTLS{InsecureSkipVerify: true})
		if err != nil || !tlsOf(r).InsecureSkipVerify {
			t.Errorf("%s with --redis-insecure-skip-verify: %v; want no verification", skip, err)
		}
		plain := "redis" + strings.TrimPrefix(u, "rediss")
		if _, err := app.RedisOptions(plain, files); err == nil || !strings.Contains(err.Error(), "has no TLS, yet --redis-ca-file and --redis-cert-file and --redis-key-file is set") {
			t.Errorf("%s with the TLS files: %v; want them refused", plain, err)
		}
	}
}

func tlsOf(r *app.RedisTarget) *tls.Config {
	switch r.Form {
	case app.RedisCluster:
		return r.Cluster.TLSConfig
	case app.RedisSentinel:
		return r.Failover.TLSConfig
	}
	return r.Simple.TLSConfig
}

// A plain URL of a server in cluster mode gets a Cluster client, which
// reaches keys of every slot; one that asks for a database other than 0
// is refused, saying that a Cluster has only 0.
func TestAStandaloneURLOfAClusterNodeGetsAClusterClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seeds := testenv.RedisClusterAddrs(t)
	addr := seeds[0]
	for _, u := range []string{"redis://" + addr, "redis://" + addr + "/0", "redis://" + addr + "?addr=" + seeds[1]} {
		rdb, err := app.Redis(ctx, u, app.RedisTLS{}, nil)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if _, ok := rdb.(*redis.ClusterClient); !ok {
			t.Errorf("%s: a %T; want a *redis.ClusterClient", u, rdb)
		}
		if msg := app.EmptyCatalogue(rdb, "p"); !strings.Contains(msg, "in the Redis Cluster at "+addr) {
			t.Errorf("%s: the empty catalogue says %q; want the Cluster named", u, msg)
		}
		rdb.Close()
	}
	_, err := app.Redis(ctx, "redis://"+addr+"/3", app.RedisTLS{}, nil)
	if err == nil || !strings.Contains(err.Error(), "the Redis server at "+addr+" runs Redis Cluster, which has only database 0: drop /3 from --redis-url") {
		t.Errorf("database 3 of a Cluster node: %v; want it refused, naming the fix", err)
	}
}

// A Sentinel URL reaches the primary the Sentinels name, with the
// primary's password from password= and the Sentinels' from the URL's
// user:password@; each wrong part is named, without a password.
func TestASentinelURLReachesThePrimaryAndNamesWhatIsWrong(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const pw, spw = "data-Sekr1t", "sentinel-Sekr1t"
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{Password: pw, SentinelPassword: spw})
	rdb, err := app.Redis(ctx, g.URL, app.RedisTLS{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if _, ok := rdb.(*redis.Client); !ok {
		t.Errorf("a %T; want a *redis.Client (go-redis's FailoverClient)", rdb)
	}
	key := testenv.Prefix(t)
	if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	defer g.Primary.Client.Del(ctx, key)
	if got := g.Primary.Client.Get(ctx, key).Val(); got != "v" {
		t.Errorf("the primary holds %q; want v", got)
	}
	if msg := app.EmptyCatalogue(rdb, "p"); !strings.Contains(msg, "in Redis database 0 of the Sentinels' primary") {
		t.Errorf("the empty catalogue says %q; want the Sentinels' primary named", msg)
	}
	for _, tc := range []struct{ from, to, want string }{
		{"master_name=" + testenv.SentinelMaster, "master_name=other", `know no primary named "other": give master_name=`},
		{"password=" + pw, "password=wrong", `the Redis primary "batchmr" of the Sentinels at ` + g.Sentinels[0].Client.Options().Addr + ", "},
		{"password=" + pw, "password=wrong", "refused: WRONGPASS"},
		{":" + spw + "@", ":wrong@", "check the user:password@ of --redis-url (env REDIS_URL), which is the Sentinels'"},
	} {
		u := strings.Replace(g.URL, tc.from, tc.to, 1)
		_, err := app.Redis(ctx, u, app.RedisTLS{}, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), spw) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line with %q, without a password", app.Redact(u), err, tc.want)
		}
	}
}

// Over TLS, a Cluster URL and a cluster node's plain rediss:// URL take
// the CA and the client certificate of the TLS flags to every node;
// without the CA, the error names the Cluster, the unknown authority and
// --redis-ca-file.
func TestAClusterOverTLSTakesTheTLSFlags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	certs := testenv.TLSCertificates(t)
	srv := testenv.PrivateRedisCluster(t, certs)
	node := strings.TrimPrefix(srv.URL, "rediss://")
	files := app.RedisTLS{CAFile: certs.CA, CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}
	for _, u := range []string{srv.URL + "?addr=" + node, srv.URL} {
		rdb, err := app.Redis(ctx, u, files, nil)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if _, ok := rdb.(*redis.ClusterClient); !ok {
			t.Errorf("%s: a %T; want a *redis.ClusterClient", u, rdb)
		}
		key := testenv.Prefix(t)
		if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil || srv.Client.Get(ctx, key).Val() != "v" {
			t.Errorf("%s: SET: %v; want the node to hold the key", u, err)
		}
		rdb.Close()
	}
	_, err := app.Redis(ctx, srv.URL+"?addr="+node, app.RedisTLS{CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}, nil)
	if err == nil || !strings.Contains(err.Error(), "the Redis Cluster at "+node+", "+node+" sent a certificate signed by an unknown authority") || !strings.Contains(err.Error(), "--redis-ca-file") {
		t.Errorf("without the CA: %v; want the Cluster named, the unknown authority and --redis-ca-file", err)
	}
}

// Over TLS, a Sentinel URL takes the CA and the client certificate of
// the TLS flags to the Sentinels and the primary alike; without the CA,
// the error names the Sentinels, the unknown authority and
// --redis-ca-file.
func TestSentinelsOverTLSTakeTheTLSFlags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	certs := testenv.TLSCertificates(t)
	g := testenv.PrivateSentinels(t, testenv.SentinelOptions{Password: "data-pw", TLS: certs})
	rdb, err := app.Redis(ctx, g.URL, app.RedisTLS{CAFile: certs.CA, CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}, nil)
	if err != nil {
		t.Fatalf("%s: %v", g.URL, err)
	}
	defer rdb.Close()
	key := testenv.Prefix(t)
	if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil || g.Primary.Client.Get(ctx, key).Val() != "v" {
		t.Errorf("SET: %v; want the primary to hold the key", err)
	}
	_, err = app.Redis(ctx, g.URL, app.RedisTLS{CertFile: certs.Client.Cert, KeyFile: certs.Client.Key}, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "the Sentinels at "+g.Sentinels[0].Client.Options().Addr+", ") || !strings.Contains(err.Error(), "sent a certificate signed by an unknown authority") ||
		!strings.Contains(err.Error(), "--redis-ca-file") || strings.Contains(err.Error(), "\n") {
		t.Errorf("without the CA: %v; want one line naming the Sentinels, the unknown authority and --redis-ca-file", err)
	}
}
