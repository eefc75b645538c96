package main

import (
	"context"
	"flag"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// conn is what every command connects to.
type conn struct {
	rdb *redis.Client
	mr  *mapreduce.Client
}

func redisFlag(fs *flag.FlagSet) *string {
	return fs.String("redis-url", app.Env("REDIS_URL", ""), "Redis URL (env REDIS_URL)")
}

// connect connects to Redis and registers the bundled jobs (without a
// database: the scheduler never runs them).
func connect(ctx context.Context, url string) *conn {
	rdb, mr := app.Client(ctx, url)
	return &conn{rdb: rdb, mr: mr}
}

func (c *conn) close() { c.rdb.Close() }

// parse parses flags wherever they stand among the positional arguments
// ("run JOB --wait" and "run --wait JOB" alike) and returns the positional
// ones, exiting on a bad command line.
func parse(fs *flag.FlagSet, usage string, args []string) []string {
	var pos []string
	for {
		app.Parse(fs, usage, args)
		if fs.NArg() == 0 {
			return pos
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// want checks the number of positional arguments.
func want(pos []string, min, max int, what string) {
	if len(pos) < min {
		app.Usage("missing %s", what)
	}
	if len(pos) > max {
		app.Usage("unexpected argument %q", pos[max])
	}
}
