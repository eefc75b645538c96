package app_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/testenv"
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
	_, err = app.Redis(ctx, redisURL.String())
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "DB index is out of range") || strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("Redis database 99: %v; want a refusal that quotes the server", err)
	}
	if _, err = app.Redis(ctx, "redis://127.0.0.1:1/0"); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("Redis on a closed port: %v; want 'cannot reach'", err)
	}

	dbURL, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Path = "/no_such_database_" + strings.ReplaceAll(testenv.Prefix(t)[len(testenv.Prefix(t))-8:], ":", "")
	_, err = app.Postgres(ctx, dbURL.String(), "app-test", 1)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("a Postgres database that does not exist: %v; want a refusal that quotes the server", err)
	}
	if _, err = app.Postgres(ctx, "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", "app-test", 1); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("Postgres on a closed port: %v; want 'cannot reach'", err)
	}
}
