package semaphore

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Defaults for Options.
const (
	DefaultLease  = 30 * time.Second
	DefaultPrefix = "batchmr:sem"

	// DefaultReplicaWait bounds each WAIT for a replica's acknowledgement.
	DefaultReplicaWait = time.Second

	// MinLease is the shortest lease New accepts: the watchdog refreshes
	// every Lease/3, and a shorter interval than a few milliseconds would
	// spend more time refreshing than working.
	MinLease = 30 * time.Millisecond

	// MaxLimit is the largest limit a semaphore takes, and so the heaviest
	// weight a request may ask for: far above any database's connections,
	// and low enough that every sum of weights stays exact in Redis's Lua.
	// New, SetLimit and the scripts themselves refuse a larger one.
	MaxLimit = 1 << 20
)

// Options configure a Semaphore. The zero value of every field but Limit
// selects its default.
type Options struct {
	// Limit is the fleet-wide number of permits (the sum of weights that may
	// be held at once). It is written to Redis only when Redis has no limit
	// for this semaphore yet; after that the limit in Redis rules, and only
	// SetLimit changes it. Required: from 1 to MaxLimit.
	Limit int

	// Lease is how long a permit stays valid without a refresh. While a
	// permit is held, this process refreshes it every Lease/3; a holder that
	// crashes gives its permit back within Lease, and a waiter that crashes
	// gives up its place in the queue within Lease. Default DefaultLease
	// (30s); at least MinLease.
	Lease time.Duration

	// Prefix starts every Redis key of the semaphore:
	// "<Prefix>:{<name>}:limit", ":holders", ":queue" and so on.
	// Default DefaultPrefix ("batchmr:sem").
	Prefix string

	// Logger receives warnings about Redis errors in the background
	// (refreshes, wake-ups). Default slog.Default().
	Logger *slog.Logger

	// ReplicaWait is how long a grant or a limit change waits for a
	// replica to acknowledge it (WAIT), where the Redis primary has
	// replicas; a deployment without replicas sends no WAIT. A grant is
	// handed over once a replica has it; if none has it within
	// ReplicaWait, it is handed over all the same, with a warning (see
	// docs/semaphore.md, "Through a Redis failover"), unless the
	// Acquire's context ends first. One WAIT lasts at most half the redis
	// client's ReadTimeout; a longer ReplicaWait sends several. Default
	// DefaultReplicaWait (1s); a negative value sends no WAIT at all,
	// giving up that guarantee through a failover.
	ReplicaWait time.Duration

	// Observer, if not nil, is told of every grant, release and lost lease
	// of this handle's permits (see Observer). Nil: none.
	Observer Observer
}

// withDefaults validates o and fills in its defaults.
func (o Options) withDefaults(name string) (Options, error) {
	if name == "" {
		return o, fmt.Errorf("semaphore: empty name: give the semaphore a name that every process sharing it uses, such as \"db\"")
	}
	if strings.ContainsAny(name, "{}") {
		return o, fmt.Errorf("semaphore %q: the name must not contain '{' or '}': they would break the Redis Cluster hash tag that keeps its keys in one slot", name)
	}
	if o.Limit < 1 || o.Limit > MaxLimit {
		return o, fmt.Errorf("semaphore %q: Options.Limit is %d: set it to the number of permits the fleet may hold at once: at least 1, at most %d (MaxLimit)", name, o.Limit, MaxLimit)
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.Lease < MinLease {
		return o, fmt.Errorf("semaphore %q: Options.Lease %v is shorter than the minimum %v", name, o.Lease, MinLease)
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return o, fmt.Errorf("semaphore %q: Options.Prefix %q must not contain '{' or '}'", name, o.Prefix)
	}
	if o.ReplicaWait == 0 {
		o.ReplicaWait = DefaultReplicaWait
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
