package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RedisTLS is how a Redis connection uses TLS beyond what its URL says: a
// rediss:// URL turns TLS on, and these settings say whom to trust and
// who this client is. The zero value verifies the server against the
// system's CAs and sends no client certificate.
type RedisTLS struct {
	// CAFile is a PEM file of the CA (or CAs) that signed the server's
	// certificate (--redis-ca-file, REDIS_CA_FILE). Empty: the system's
	// CAs.
	CAFile string
	// CertFile and KeyFile are the PEM files of this client's certificate
	// and its key, for a server that requires one (tls-auth-clients yes)
	// (--redis-cert-file, REDIS_CERT_FILE; --redis-key-file,
	// REDIS_KEY_FILE). Both or neither.
	CertFile, KeyFile string
	// InsecureSkipVerify accepts any certificate the server sends, so
	// that anyone on the path can read and change the traffic
	// (--redis-insecure-skip-verify, REDIS_INSECURE_SKIP_VERIFY). A URL's
	// skip_verify=true is refused without it. A client connected so logs
	// a warning.
	InsecureSkipVerify bool
	// Config, if not nil, is the TLS configuration to start from (it is
	// cloned, then the files above are added), for what no file gives,
	// such as certificates held in memory. Its ServerName defaults to the
	// URL's host.
	Config *tls.Config
}

func (t RedisTLS) any() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.InsecureSkipVerify || t.Config != nil
}

// AddFlags registers --redis-ca-file, --redis-cert-file, --redis-key-file
// and --redis-insecure-skip-verify on fs, each with its environment
// variable as default, setting t. A malformed variable returns a
// *UsageError naming it, the flags registered all the same.
func (t *RedisTLS) AddFlags(fs *flag.FlagSet) error {
	fs.StringVar(&t.CAFile, "redis-ca-file", Env("REDIS_CA_FILE", ""), "PEM file of the CA that signed Redis's certificate, for a rediss:// URL; default: the system's CAs (env REDIS_CA_FILE)")
	fs.StringVar(&t.CertFile, "redis-cert-file", Env("REDIS_CERT_FILE", ""), "PEM file of this client's certificate, for a Redis that requires one (tls-auth-clients yes) (env REDIS_CERT_FILE)")
	fs.StringVar(&t.KeyFile, "redis-key-file", Env("REDIS_KEY_FILE", ""), "PEM file of the key of --redis-cert-file (env REDIS_KEY_FILE)")
	insecure, err := EnvBool("REDIS_INSECURE_SKIP_VERIFY", false)
	fs.BoolVar(&t.InsecureSkipVerify, "redis-insecure-skip-verify", insecure, "accept any certificate from Redis: insecure, for tests only; allows skip_verify=true in the URL (env REDIS_INSECURE_SKIP_VERIFY)")
	return err
}

// apply applies t to parsed, the TLS configuration that go-redis read
// from rawURL (nil: the URL has no TLS), and returns the configuration to
// connect with. It returns an error that names the flag and the fix when
// a file of t cannot be read, when t is set for a URL without TLS, or when
// the URL asks for skip_verify=true without t.InsecureSkipVerify.
func (t RedisTLS) apply(parsed *tls.Config, rawURL string) (*tls.Config, error) {
	if parsed == nil {
		if t.any() {
			return nil, fmt.Errorf("--redis-url (env REDIS_URL) %s has no TLS, yet %s is set: use a rediss:// URL for TLS, or drop the TLS settings",
				Redact(rawURL), t.named())
		}
		return nil, nil
	}
	if parsed.InsecureSkipVerify && !t.InsecureSkipVerify {
		return nil, errors.New("--redis-url (env REDIS_URL) has skip_verify=true, which accepts any certificate from Redis: " +
			"give Redis's CA with --redis-ca-file (env REDIS_CA_FILE) and drop skip_verify, or, for a test, add --redis-insecure-skip-verify (env REDIS_INSECURE_SKIP_VERIFY=true)")
	}
	cfg := parsed
	if t.Config != nil {
		cfg = t.Config.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = parsed.ServerName
		}
		cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	}
	cfg.InsecureSkipVerify = cfg.InsecureSkipVerify || t.InsecureSkipVerify
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-ca-file (env REDIS_CA_FILE): %w: give the PEM file of the CA that signed Redis's certificate", err)
		}
		pool := x509.NewCertPool()
		if cfg.RootCAs != nil {
			pool = cfg.RootCAs.Clone() // Config's CAs, and the file's
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-ca-file (env REDIS_CA_FILE) %s holds no PEM certificate: give the PEM file of the CA that signed Redis's certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-cert-file and --redis-key-file (env REDIS_CERT_FILE, REDIS_KEY_FILE): %w: give the PEM files of this client's certificate and of its key", err)
		}
		cfg.Certificates = append(cfg.Certificates, pair)
	case t.CertFile != "":
		return nil, errors.New("--redis-cert-file (env REDIS_CERT_FILE) without --redis-key-file (env REDIS_KEY_FILE): give the PEM file of the certificate's key too")
	case t.KeyFile != "":
		return nil, errors.New("--redis-key-file (env REDIS_KEY_FILE) without --redis-cert-file (env REDIS_CERT_FILE): give the PEM file of the client's certificate too")
	}
	return cfg, nil
}

// named lists the TLS settings that are set, by their flags.
func (t RedisTLS) named() string {
	var set []string
	for _, s := range []struct {
		on   bool
		name string
	}{{t.CAFile != "", "--redis-ca-file"}, {t.CertFile != "", "--redis-cert-file"}, {t.KeyFile != "", "--redis-key-file"},
		{t.InsecureSkipVerify, "--redis-insecure-skip-verify"}, {t.Config != nil, "a TLS configuration"}} {
		if s.on {
			set = append(set, s.name)
		}
	}
	return strings.Join(set, " and ")
}

// insecureWarning is what a client that does not verify Redis's
// certificate logs when it connects.
const insecureWarning = "Redis's certificate is not verified (--redis-insecure-skip-verify): anyone on the path can read and change what this process sends; " +
	"give Redis's CA with --redis-ca-file instead"

// redisTLSError says why a TLS connection to server (Server's words),
// configured with cfg (nil: no TLS), failed and which flag fixes it, or
// returns nil when err is no TLS failure.
func redisTLSError(server string, cfg *tls.Config, err error) error {
	tlsOn := cfg != nil
	hasCert := tlsOn && (len(cfg.Certificates) > 0 || cfg.GetClientCertificate != nil)
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		var (
			unknown  x509.UnknownAuthorityError
			hostname x509.HostnameError
			invalid  x509.CertificateInvalidError
		)
		switch {
		case errors.As(verify.Err, &unknown):
			return fmt.Errorf("%s sent a certificate signed by an unknown authority (%v): "+
				"give the PEM file of the CA that signed it with --redis-ca-file (env REDIS_CA_FILE)", server, verify.Err)
		case errors.As(verify.Err, &hostname):
			return fmt.Errorf("%s sent a certificate for another name (%v): "+
				"connect by a name the certificate was issued for in --redis-url (env REDIS_URL), or reissue the server's certificate (tls-cert-file) for the name you use", server, verify.Err)
		case errors.As(verify.Err, &invalid) && invalid.Reason == x509.Expired:
			return fmt.Errorf("%s sent a certificate that has expired or is not valid yet (%v): "+
				"renew the server's certificate (tls-cert-file), or correct this host's clock if it is wrong", server, verify.Err)
		}
		return fmt.Errorf("%s sent a certificate that did not verify (%v): "+
			"give the PEM file of the CA that signed it with --redis-ca-file (env REDIS_CA_FILE)", server, verify.Err)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		switch alert := op.Err.Error(); {
		// TLS 1.3 says so; TLS 1.2 servers end the handshake.
		case alert == "tls: certificate required" || alert == "tls: handshake failure" && !hasCert:
			return fmt.Errorf("%s requires a client certificate (%v): "+
				"give this client's with --redis-cert-file and --redis-key-file (env REDIS_CERT_FILE, REDIS_KEY_FILE)", server, op.Err)
		case hasCert && slices.Contains([]string{"tls: bad certificate", "tls: unknown certificate authority", "tls: certificate expired",
			"tls: unsupported certificate", "tls: revoked certificate", "tls: unknown certificate"}, alert):
			return fmt.Errorf("%s refused this client's certificate (%v): "+
				"give with --redis-cert-file (env REDIS_CERT_FILE) a valid certificate signed by a CA the server trusts (its tls-ca-cert-file), and its key with --redis-key-file", server, op.Err)
		}
	}
	var record tls.RecordHeaderError
	if errors.As(err, &record) {
		return fmt.Errorf("%s does not speak TLS: use a redis:// URL in --redis-url (env REDIS_URL), or turn TLS on in Redis (tls-port)", server)
	}
	if !tlsOn && (errors.Is(err, io.EOF) || strings.Contains(err.Error(), "connection reset by peer")) {
		return fmt.Errorf("%s closed the connection (%v): if it takes TLS only, use a rediss:// URL in --redis-url (env REDIS_URL); otherwise check that it is up", server, err)
	}
	return nil
}

// urlCause is why rawURL did not parse, without the URL, which
// url.Error quotes whole, and without any piece of its password.
func urlCause(err error, rawURL string) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return "not a URL"
	}
	cause := ue.Err.Error()
	redacted := Redact(rawURL)
	if redacted != rawURL {
		// The cause quotes a piece of the URL: if that piece is gone from
		// the redacted form, it was the password's.
		if i := strings.IndexByte(cause, '"'); i >= 0 {
			if j := strings.IndexByte(cause[i+1:], '"'); j >= 0 && !strings.Contains(redacted, cause[i+1:i+1+j]) {
				return "the password has a character that a URL must percent-encode (% as %25, @ as %40, / as %2F)"
			}
		}
	}
	return cause
}

// PostgresTLSWarning returns a warning when the Postgres URL rawURL
// points at a host beyond this one with an sslmode that lets the
// connection fall back to no TLS (prefer, pgx's default when the URL
// gives none and PGSSLMODE is unset, or allow), and "" otherwise,
// including when it does not parse (Postgres's own error says why).
func PostgresTLSWarning(rawURL string) string {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return ""
	}
	cc := cfg.ConnConfig.Config
	remote, plain, tlsOn := false, cc.TLSConfig == nil, cc.TLSConfig != nil
	for _, fb := range cc.Fallbacks {
		plain = plain || fb.TLSConfig == nil
		tlsOn = tlsOn || fb.TLSConfig != nil
		remote = remote || !localHost(fb.Host)
	}
	remote = remote || !localHost(cc.Host)
	if !remote || !plain || !tlsOn {
		return "" // local, or TLS always, or never (sslmode=disable: said on purpose)
	}
	mode := "an sslmode (prefer or allow) that falls back to no TLS,"
	if !strings.Contains(rawURL, "sslmode") && os.Getenv("PGSSLMODE") == "" {
		mode = "no sslmode, which pgx reads as prefer,"
	}
	return fmt.Sprintf("--database-url (env DATABASE_URL) to %s has %s so an attacker on the path can make it connect without TLS, and the server's certificate is not verified: "+
		"add sslmode=verify-full&sslrootcert=FILE (the PEM file of the CA that signed Postgres's certificate), or sslmode=disable on a network you trust", cc.Host, mode)
}

// localHost reports whether host is this machine: a unix socket's
// directory, localhost, or a loopback address.
func localHost(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
