package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"github.com/batchmr/batchmr/internal/app"
)

// redisFlags are where every command finds Redis: --redis-url and its
// TLS settings, which connect reads.
type redisFlags struct {
	url string
	tls app.RedisTLS
}

// redisFlag registers the Redis flags on fs: --redis-url and the TLS
// flags (--redis-ca-file, --redis-cert-file, --redis-key-file,
// --redis-insecure-skip-verify). A malformed environment variable
// returns a *app.UsageError.
func redisFlag(fs *flag.FlagSet) (*redisFlags, error) {
	r := &redisFlags{}
	fs.StringVar(&r.url, "redis-url", app.Env("REDIS_URL", ""), "Redis URL: redis://host:port/db, redis://host:port?addr=host2:port2 (Cluster) or redis://sentinel:26379/db?master_name=NAME (Sentinel); rediss:// for TLS (env REDIS_URL)")
	return r, r.tls.AddFlags(fs)
}

// parse parses flags wherever they stand among the positional arguments
// ("run JOB --wait" and "run --wait JOB" alike) and returns the positional
// ones; it returns app.Parse's error for --help (which prints the usage on
// stdout) and a bad flag. A negative number ("permits set db
// -1") is a positional argument, not an unknown flag, unless it is the
// value of the flag before it ("--key -1"); after "--" every argument is
// positional.
func parse(fs *flag.FlagSet, usage string, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if isNegative(args[0]) {
			pos = append(pos, args[0])
			args = args[1:]
			continue
		}
		// The flag package would take a negative number for a flag: parse
		// only up to the next one.
		cut := len(args)
		for i := 1; i < len(args); i++ {
			if isNegative(args[i]) && !takesValue(fs, args[i-1]) {
				cut = i
				break
			}
		}
		if err := app.Parse(fs, usage, args[:cut], stdout); err != nil {
			return nil, err
		}
		rest := append(fs.Args(), args[cut:]...)
		if end := cut - fs.NArg() - 1; end >= 0 && args[end] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return pos, nil
}

func isNegative(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil && strings.HasPrefix(s, "-")
}

// takesValue reports whether arg is a flag of fs that reads the next
// argument as its value: a defined, non-boolean flag with no "=value".
func takesValue(fs *flag.FlagSet, arg string) bool {
	if !strings.HasPrefix(arg, "-") || strings.Contains(arg, "=") {
		return false
	}
	f := fs.Lookup(strings.TrimLeft(arg, "-"))
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// want checks the number of positional arguments: a *app.UsageError
// names what is missing or the first argument too many.
func want(pos []string, min, max int, what string) error {
	if len(pos) < min {
		return app.Usagef("missing %s", what)
	}
	if len(pos) > max {
		return app.Usagef("unexpected argument %q", pos[max])
	}
	return nil
}

// connectForRun parses the flags of fs, url among them, and the one RUN
// of a command about a run (status, cancel, retry), and connects to Redis.
func connectForRun(ctx context.Context, fs *flag.FlagSet, url *redisFlags, usage string, args []string, stdout, stderr io.Writer) (*conn, string, error) {
	pos, err := parse(fs, usage, args, stdout)
	if err != nil {
		return nil, "", err
	}
	if err := want(pos, 1, 1, "RUN (a run ID, as 'scheduler run' or 'scheduler runs' print it)"); err != nil {
		return nil, "", err
	}
	c, err := connect(ctx, *url, stderr) // url is set once fs is parsed
	return c, pos[0], err
}

// logFlags adds --log-format and --log-level to fs, and returns what makes
// the logger they ask for, on stderr, once fs is parsed.
func logFlags(fs *flag.FlagSet) func(stderr io.Writer) (*slog.Logger, error) {
	format := fs.String("log-format", app.Env("LOG_FORMAT", "text"), "text or json (env LOG_FORMAT)")
	level := fs.String("log-level", app.Env("LOG_LEVEL", "info"), "debug, info, warn or error: the least severe records logged (env LOG_LEVEL)")
	return func(stderr io.Writer) (*slog.Logger, error) {
		log, err := app.NewLogger(stderr, *format, *level)
		if err != nil {
			return nil, app.Usagef("%v", err)
		}
		return log, nil
	}
}
