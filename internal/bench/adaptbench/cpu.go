package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
)

// clockTick is USER_HZ, the unit of /proc's CPU times on Linux.
const clockTick = 10 * time.Millisecond

// cpuUse is CPU time used so far: by the whole machine, by the Postgres
// server's processes, by Redis and by this process. Between two readings,
// what the machine used beyond the other three is other load competing
// with the run.
type cpuUse struct {
	machine, postgres, redis, own time.Duration
}

func (b *bench) cpuNow(ctx context.Context) cpuUse {
	u := benchutil.TakeUse(ctx, b.rdb)
	c := cpuUse{machine: machineBusy(), redis: u.RedisCPU, own: u.OwnCPU}
	if pids, err := b.group.Procs(); err == nil {
		for _, pid := range pids {
			c.postgres += processCPU(pid)
		}
	}
	return c
}

// cores returns the cores Postgres and the other processes (but Redis and
// this one) used on average between before and c.
func (c cpuUse) cores(before cpuUse, wall time.Duration) (postgres, others float64) {
	return float64(c.postgres-before.postgres) / float64(wall), c.others(before, wall)
}

// others returns the cores that processes other than Postgres, Redis and
// this one used on average between before and c, over wall.
func (c cpuUse) others(before cpuUse, wall time.Duration) float64 {
	d := (c.machine - before.machine) - (c.postgres - before.postgres) - (c.redis - before.redis) - (c.own - before.own)
	return max(0, float64(d)/float64(wall))
}

// machineBusy reads the machine's non-idle CPU time from /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is in user already
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * clockTick
}

// processCPU reads the user and system time of pid from /proc.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // state ppid ... utime is field 14 of the line, here index 11
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * clockTick
}
