package app_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/tests/testenv"
)

// A server that answered with an error is not unreachable: the message
// says what it refused and what to check, and only a server that did not
// answer is said to be out of reach.
func TestConnectErrorsTellAServerThatRefusedFromOneThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	redisURL, err := url.Parse(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	redisURL.Path = "/99"
	_, err = app.Redis(ctx, redisURL.String(), app.RedisTLS{}, nil)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "DB index is out of range") || strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("Redis database 99: %v; want a refusal that quotes the server", err)
	}
	if _, err = app.Redis(ctx, "redis://127.0.0.1:1/0", app.RedisTLS{}, nil); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("Redis on a closed port: %v; want 'cannot reach'", err)
	}

	dbURL, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Path = "/no_such_database_" + strings.ReplaceAll(testenv.Prefix(t)[len(testenv.Prefix(t))-8:], ":", "")
	_, err = app.Postgres(ctx, dbURL.String(), "app-test", 1, nil)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("a Postgres database that does not exist: %v; want a refusal that quotes the server", err)
	}
	if _, err = app.Postgres(ctx, "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", "app-test", 1, nil); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("Postgres on a closed port: %v; want 'cannot reach'", err)
	}
	// host:port alone, as for Redis: not a URL pgx can read.
	if _, err = app.Postgres(ctx, "localhost:5432", "app-test", 1, nil); err == nil || !strings.Contains(err.Error(), "give a URL such as postgres://user:password@host:5432/dbname") {
		t.Errorf("a DATABASE_URL of host:port: %v; want an error showing a URL's form", err)
	}

	// The test server runs without TLS: a URL that requires it reaches a
	// server that is up, and the fix is the URL's sslmode.
	tlsURL, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := tlsURL.Query()
	q.Set("sslmode", "require")
	tlsURL.RawQuery = q.Encode()
	pool, err := app.Postgres(ctx, tlsURL.String(), "app-test", 1, nil)
	if err == nil {
		pool.Close()
		t.Log("the test server accepts TLS: its refusal is not checked")
	} else if !strings.Contains(err.Error(), "does not accept TLS") || !strings.Contains(err.Error(), "sslmode=disable") || strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("sslmode=require against a server without TLS: %v; want the sslmode named as the fix", err)
	}

	// A bare host:port is not a Redis URL: the message shows one.
	if _, err = app.Redis(ctx, "localhost:6379", app.RedisTLS{}, nil); err == nil || !strings.Contains(err.Error(), "redis://localhost:6379/0") {
		t.Errorf("REDIS_URL=localhost:6379: %v; want the URL's form, with an example", err)
	}
}

// --log-level and --log-format take exactly the values their help names,
// in any case; anything else is refused naming the flag, its variable and
// those values. The level drops what is below it.
func TestLoggerTakesTheNamedLevelsAndFormatsAndRefusesOthers(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	log, err := app.NewLogger(&b, "JSON", "Warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept")
	if out := b.String(); strings.Contains(out, "dropped") || !strings.Contains(out, `"msg":"kept"`) {
		t.Errorf("a JSON logger at warn wrote %q", out)
	}
	for _, lv := range []string{"debug", "info", "warn", "error"} {
		if _, err := app.NewLogger(&b, "text", lv); err != nil {
			t.Errorf("level %q: %v", lv, err)
		}
	}
	for _, tc := range []struct{ format, level, want string }{
		{"text", "warning", `--log-level "warning" (env LOG_LEVEL): use debug, info, warn or error`},
		{"text", "DEBUG+2", `--log-level "DEBUG+2" (env LOG_LEVEL): use debug, info, warn or error`},
		{"text", "", `--log-level "" (env LOG_LEVEL): use debug, info, warn or error`},
		{"logfmt", "info", `--log-format "logfmt" (env LOG_FORMAT): use text or json`},
	} {
		if _, err := app.NewLogger(&b, tc.format, tc.level); err == nil || err.Error() != tc.want {
			t.Errorf("NewLogger(%q, %q): %v; want %q", tc.format, tc.level, err, tc.want)
		}
	}
}

// JSONError accepts every JSON text json.Valid does, and says why and
// where for one it does not.
func TestJSONErrorSaysWhyAndWhere(t *testing.T) {
	for _, ok := range []string{`{"n": 1}`, `1e400`, `[1, "a", null]`} {
		if err := app.JSONError(ok); err != nil {
			t.Errorf("JSONError(%s): %v, want nil", ok, err)
		}
	}
	if err := app.JSONError(`{n: 1}`); err == nil || !strings.Contains(err.Error(), "at byte 2") {
		t.Errorf("JSONError({n: 1}): %v; want the parser's error and where", err)
	}
}

// BATCHMR_PREFIX set but empty, as compose passes an unset variable, is the
// default, as the worker reads it: a scheduler that read "" would set the
// limit of semaphores no worker uses.
func TestAnEmptyPrefixIsTheDefaultAsTheWorkerReadsIt(t *testing.T) {
	for v, want := range map[string]string{"": "batchmr", "team-a": "team-a"} {
		if got := app.PrefixOf(v); got != want {
			t.Errorf("BATCHMR_PREFIX=%q reads as %q, want %q", v, got, want)
		}
	}
}
