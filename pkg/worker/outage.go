package worker

import (
	"context"
	"errors"
	"strings"

	"github.com/batchmr/batchmr/internal/outage"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/redis/go-redis/v9"
)

// asynqOutage returns the Redis outage that msg, a warning or error of
// asynq's, reports, or "". asynq keeps Redis's errors only as text in its
// own ("Failed to write server state data: UNKNOWN: redis command error:
// SADD failed: dial tcp …: connection refused"), so the text decides.
func asynqOutage(msg string) outage.Cause {
	for _, code := range []string{"READONLY ", "LOADING ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN "} {
		if strings.Contains(msg, code) {
			return outage.RedisFailover
		}
	}
	if rediserr.Transient(errors.New(msg)) || strings.Contains(msg, "dial ") {
		return outage.Redis
	}
	return ""
}

// redisBack is a hook of the worker's Redis client that ends its Redis
// outages (o) when Redis answers again: an outage of Redis unreachable at
// any command's success; one of a failover (READONLY from a demoted
// primary, which still answers reads) at a write's.
type redisBack struct{ o *outage.Log }

var _ redis.Hook = redisBack{}

func (h redisBack) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisBack) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.o.Ongoing() && (err == nil || errors.Is(err, redis.Nil)) {
			h.answered([]redis.Cmder{cmd})
		}
		return err
	}
}

func (h redisBack) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.o.Ongoing() && (err == nil || errors.Is(err, redis.Nil)) {
			h.answered(cmds)
		}
		return err
	}
}

// answered ends the outages that cmds, which Redis carried out, show over.
func (h redisBack) answered(cmds []redis.Cmder) {
	h.o.Ended(outage.Redis, "")
	for _, c := range cmds {
		if writes[c.Name()] {
			h.o.Ended(outage.RedisFailover, "")
			return
		}
	}
}

// writes are the commands asynq and batchmr write with: a replica
// refuses them (READONLY).
var writes = map[string]bool{
	"eval": true, "evalsha": true, "fcall": true, "set": true, "setex": true, "del": true, "unlink": true,
	"hset": true, "hincrby": true, "hdel": true, "zadd": true, "zrem": true, "sadd": true, "srem": true,
	"lpush": true, "rpush": true, "lrem": true, "incr": true, "expire": true, "pexpire": true, "exec": true,
}
