package main

import (
	"context"
	"io"
	"strings"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// conn is what every command connects to: Redis, and a mapreduce client
// that runs no job of its own. It starts and inspects runs of any job the
// catalogue lists.
type conn struct {
	rdb    redis.UniversalClient
	mr     *mapreduce.Client
	server string // what rdb reaches, for messages: "the Redis server at ADDR"
}

// connect connects to Redis, logging its warnings (an unverified
// certificate) on stderr; its error is one line that names the fix.
func connect(ctx context.Context, r redisFlags, stderr io.Writer) (*conn, error) {
	log, _ := app.NewLogger(stderr, "text", "warn")
	target, err := app.RedisOptions(r.url, r.tls)
	if err != nil {
		return nil, err
	}
	rdb, err := target.Connect(ctx, log)
	if err != nil {
		return nil, err
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: app.Prefix, Logger: log})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &conn{rdb: rdb, mr: mr, server: target.Server()}, nil
}

func (c *conn) close() { c.rdb.Close() }

// trim drops the package prefix of a mapreduce error: the command's own
// name already starts the line. Redis's refusal over maxmemory gets the
// fix, which its own text does not give.
func trim(err error) string {
	msg := strings.TrimPrefix(err.Error(), "mapreduce: ")
	if strings.Contains(msg, "OOM command not allowed") {
		msg += ": Redis is over its maxmemory: raise it (CONFIG SET maxmemory, and in redis.conf), or free memory " +
			"(a finished run's keys go when its retention ends); docs/operations.md sizes Redis for a run"
	}
	return msg
}
