package semaphore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Stats is a consistent snapshot of a semaphore across the fleet.
type Stats struct {
	Name    string
	Limit   int       // the fleet-wide limit in Redis; 0 if none is set yet (Stats never sets one)
	Held    int       // sum of the weights of Holders; may exceed Limit briefly after SetLimit lowered it
	Holders []Holder  // in grant order (by fence): the oldest grant first
	Waiters []Waiter  // in grant order: the first is served next
	Auto    AutoState // who sets the limit: Auto.Mode is ModeFixed unless SetAuto
}

// Holder is one granted permit.
type Holder struct {
	ID        string        // the permit's token: Permit.ID
	Process   string        // the holding process: host, pid and a random suffix
	Weight    int           // the weight the permit was acquired with
	Fence     int64         // Permit.Fence
	HeldFor   time.Duration // since the grant
	LeaseLeft time.Duration // until the lease runs out unless refreshed
}

// Waiter is one queued request.
type Waiter struct {
	ID      string
	Process string
	Weight  int
	Ticket  int64         // queue position number: smaller is served first
	Age     time.Duration // time spent in the queue
}

// Stats returns who holds and who waits for the semaphore now, after
// removing holders whose leases ran out and waiters whose processes died,
// and its mode, after a due fall-back to the fixed N (see RunController).
func (s *Semaphore) Stats(ctx context.Context) (Stats, error) {
	res, err := s.eval(ctx, scriptStats)
	if err != nil {
		return Stats{}, fmt.Errorf("semaphore %q: stats: %w", s.name, err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != 8 {
		return Stats{}, fmt.Errorf("semaphore %q: stats: unexpected reply %v", s.name, res)
	}
	limit, _ := vals[0].(int64)
	now, _ := vals[1].(int64)
	st := Stats{Name: s.name, Limit: int(limit), Auto: parseAuto(str(vals[4]), now)}
	if sig := str(vals[5]); sig != "" && st.Auto.Mode != ModeFixed {
		_ = json.Unmarshal([]byte(sig), &st.Auto.Signals) // written by this package's controller alone
		st.Auto.Signals.Age = ms(now - parseInt(vals[6]))
	}
	if st.Auto.Mode != ModeFixed {
		st.Auto.Window = ms(parseInt(vals[7]))
	}
	holders, _ := vals[2].([]any)
	for i := 0; i+2 < len(holders); i += 3 {
		tok, _ := holders[i].(string)
		deadline := parseInt(holders[i+1])
		fence, grantedAt, _ := strings.Cut(str(holders[i+2]), ":")
		grantedAt, _, _ = strings.Cut(grantedAt, ":") // ":lost": kept past its lease for its process to release
		process, weight := parseToken(tok)
		st.Held += weight
		st.Holders = append(st.Holders, Holder{
			ID: tok, Process: process, Weight: weight,
			Fence:     parseInt(fence),
			HeldFor:   ms(now - parseInt(grantedAt)),
			LeaseLeft: ms(deadline - now),
		})
	}
	slices.SortFunc(st.Holders, func(a, b Holder) int { return cmp.Compare(a.Fence, b.Fence) })
	waiters, _ := vals[3].([]any)
	for i := 0; i+2 < len(waiters); i += 3 {
		tok, _ := waiters[i].(string)
		process, weight := parseToken(tok)
		st.Waiters = append(st.Waiters, Waiter{
			ID: tok, Process: process, Weight: weight,
			Ticket: parseInt(waiters[i+1]),
			Age:    ms(now - parseInt(waiters[i+2])),
		})
	}
	return st, nil
}

// parseToken splits "<process>:<sequence>:<weight>".
func parseToken(tok string) (process string, weight int) {
	process, rest, _ := strings.Cut(tok, ":")
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		weight, _ = strconv.Atoi(rest[i+1:])
	}
	return process, weight
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// parseInt reads a number that Redis returned as an integer or a string
// (ZSET scores arrive as strings, possibly in floating-point notation).
func parseInt(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
		f, _ := strconv.ParseFloat(v, 64)
		return int64(f)
	}
	return 0
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// ProcessStats sums up what one process holds and waits for.
type ProcessStats struct {
	Process        string
	Holds, Held    int // permits, and their weight
	LongestHold    time.Duration
	Waits, Waiting int // queued requests, and their weight
	OldestWait     time.Duration
}

// ByProcess sums up the holders and waiters of st per process, in the
// order of their first grant, then of their first queued request.
func (st Stats) ByProcess() []ProcessStats {
	var out []ProcessStats
	index := map[string]int{}
	get := func(name string) *ProcessStats {
		i, ok := index[name]
		if !ok {
			i = len(out)
			index[name] = i
			out = append(out, ProcessStats{Process: name})
		}
		return &out[i]
	}
	for _, h := range st.Holders {
		p := get(h.Process)
		p.Holds++
		p.Held += h.Weight
		p.LongestHold = max(p.LongestHold, h.HeldFor)
	}
	for _, q := range st.Waiters {
		p := get(q.Process)
		p.Waits++
		p.Waiting += q.Weight
		p.OldestWait = max(p.OldestWait, q.Age)
	}
	return out
}
