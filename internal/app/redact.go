package app

import "regexp"

// Masked stands where Redact removed a secret, as pgx writes it.
const Masked = "xxxxx"

var (
	// userinfo is the password of a URL's user:password@ (redis://,
	// rediss://, postgres://, unix://...). The password runs to the last
	// @ before the path, as url.Parse reads it.
	userinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]*:)[^\s/]*(@)`)
	// passwordParam is a password given as a parameter: in a URL's query
	// (?password=, &sentinel_password=) or a Postgres key/value
	// connection string (password='a b' or password=ab).
	passwordParam = regexp.MustCompile(`(?i)(\b[a-z_]*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'"]+)`)
)

// Redact returns s with every password of a URL or connection string in
// it replaced by Masked: the text to print, log or return in an error
// when s may hold a --redis-url or --database-url.
func Redact(s string) string {
	s = userinfo.ReplaceAllString(s, "${1}"+Masked+"${2}")
	return passwordParam.ReplaceAllString(s, "${1}"+Masked)
}
