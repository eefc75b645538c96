// Package schedules is where `scheduler serve` publishes the schedules it
// serves, so that other processes (the web console) can show each job's
// next tick. The schedules live in serve's process; this is a copy of them
// in Redis, kept alive by a heartbeat:
//
//	<prefix>:{catalog}:schedules  HASH  serve process ID -> Published (JSON)
//
// A process that stops heartbeating drops out of List after its TTL, and
// the next List deletes its entry.
package schedules

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Schedule is one job's timetable as a serve process holds it.
type Schedule struct {
	Job  string    `json:"job"`
	Spec string    `json:"spec"`
	Next time.Time `json:"next"` // the next tick, as of Published.Seen
}

// Published is what one serve process published.
type Published struct {
	Process   string     `json:"process"`
	Seen      time.Time  `json:"seen"`
	Expires   time.Time  `json:"expires"`
	Schedules []Schedule `json:"schedules"`
}

func key(prefix string) string { return prefix + ":{catalog}:schedules" }

// Publish records the schedules of process until ttl from now; call it
// again before then to keep them listed.
func Publish(ctx context.Context, rdb redis.UniversalClient, prefix, process string, ttl time.Duration, list []Schedule) error {
	now := time.Now()
	b, err := json.Marshal(Published{Process: process, Seen: now, Expires: now.Add(ttl), Schedules: list})
	if err != nil {
		return fmt.Errorf("schedules: publish: %w", err)
	}
	if err := rdb.HSet(ctx, key(prefix), process, b).Err(); err != nil {
		return fmt.Errorf("schedules: publish: %w", err)
	}
	return nil
}

// Withdraw removes the schedules of process, as it stops.
func Withdraw(ctx context.Context, rdb redis.UniversalClient, prefix, process string) error {
	if err := rdb.HDel(ctx, key(prefix), process).Err(); err != nil {
		return fmt.Errorf("schedules: withdraw: %w", err)
	}
	return nil
}

// List returns the schedules of every live serve process, sorted by job
// then spec, with duplicates (replicas serving the same schedule) merged.
// Entries past their TTL are deleted.
func List(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]Schedule, error) {
	raw, err := rdb.HGetAll(ctx, key(prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("schedules: list: %w", err)
	}
	now := time.Now()
	var out []Schedule
	for process, b := range raw {
		var p Published
		if json.Unmarshal([]byte(b), &p) != nil || now.After(p.Expires) {
			_ = rdb.HDel(ctx, key(prefix), process).Err()
			continue
		}
		for _, s := range p.Schedules {
			i := slices.IndexFunc(out, func(o Schedule) bool { return o.Job == s.Job && o.Spec == s.Spec })
			switch {
			case i < 0:
				out = append(out, s)
			case s.Next.After(out[i].Next):
				out[i] = s // the fresher replica's
			}
		}
	}
	slices.SortFunc(out, func(a, b Schedule) int {
		if c := strings.Compare(a.Job, b.Job); c != 0 {
			return c
		}
		return strings.Compare(a.Spec, b.Spec)
	})
	return out, nil
}
