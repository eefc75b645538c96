package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuRoot is the cgroup v1 CPU controller's hierarchy.
const cpuRoot = "/sys/fs/cgroup/cpu"

// cfsPeriod is the period, in µs, that the quotas below are shares of.
const cfsPeriod = 100000

// A capacity is a CPU quota for the Postgres server.
type capacity struct {
	name  string
	quota int // µs of CPU per cfsPeriod
}

func (c capacity) String() string {
	return fmt.Sprintf("%s (%.1f cores)", c.name, float64(c.quota)/cfsPeriod)
}

// cgroup is a CPU group of its own holding the Postgres server's
// processes: the postmaster and its children, and so every backend
// forked later.
type cgroup struct {
	dir string
}

// checkCgroups returns an error naming the fix when the CPU
// controller of cgroup v1 cannot be written here.
func checkCgroups() error {
	if _, err := os.Stat(filepath.Join(cpuRoot, "cgroup.procs")); err != nil {
		return fmt.Errorf("no cgroup v1 CPU controller at %s (%v): adaptbench changes the Postgres server's CPU quota there; run it on a Linux host with the cpu controller mounted (cgroup v1)", cpuRoot, err)
	}
	if err := syscall.Access(cpuRoot, 2); err != nil {
		return fmt.Errorf("%s is not writable (%v): adaptbench moves the Postgres server into a CPU group of its own; run it as root, next to the server", cpuRoot, err)
	}
	return nil
}

// newCgroup creates the group name under cpuRoot with quota, and with
// the CPU weight that backends of the server would have in the root
// group together: a group's weight (cpu.shares) counts as one task's
// there, so at the default the server would lose CPU to every other busy
// thread of the machine, and the quota would no longer be its capacity.
func newCgroup(name string, quota, backends int) (*cgroup, error) {
	g := &cgroup{dir: filepath.Join(cpuRoot, name)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", g.dir, err)
	}
	for _, set := range []func() error{
		func() error { return g.write("cpu.cfs_period_us", cfsPeriod) },
		func() error { return g.setQuota(quota) },
		func() error { return g.write("cpu.shares", min(1024*max(backends, 1), maxShares)) },
	} {
		if err := set(); err != nil {
			_ = os.Remove(g.dir)
			return nil, err
		}
	}
	return g, nil
}

// maxShares is the largest cpu.shares of cgroup v1.
const maxShares = 262144

func (g *cgroup) write(file string, v int) error {
	if err := os.WriteFile(filepath.Join(g.dir, file), []byte(strconv.Itoa(v)), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: write %s=%d: %w", g.dir, file, v, err)
	}
	return nil
}

func (g *cgroup) setQuota(quota int) error { return g.write("cpu.cfs_quota_us", quota) }

// add moves the process pid (all its threads) into the group.
func (g *cgroup) add(pid int) error {
	return g.write("cgroup.procs", pid)
}

// procs lists the processes in the group.
func (g *cgroup) procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// remove moves every process of the group back to the root group and
// removes the group. It retries briefly: a backend forked while the
// processes move lands in the group after the listing.
func (g *cgroup) remove() error {
	var errs []error
	for range 20 {
		pids, err := g.procs()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			errs = append(errs, err)
			break
		}
		for _, pid := range pids {
			// A process that exited meanwhile is gone from the group anyway.
			if err := os.WriteFile(filepath.Join(cpuRoot, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("move pid %d back to %s: %w", pid, cpuRoot, err))
			}
		}
		if err := os.Remove(g.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.Remove(g.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove cgroup %s: %w", g.dir, err))
	}
	return errors.Join(errs...)
}

// postgresProcesses finds the server the pool is connected to on this
// machine: the postmaster named by the first line of postmaster.pid in
// its data directory, checked against the parent of this connection's
// backend, and the postmaster's children.
func postgresProcesses(ctx context.Context, pool *pgxpool.Pool) (postmaster int, children []int, err error) {
	var dataDir string
	var backend int
	if err := pool.QueryRow(ctx, "SELECT current_setting('data_directory'), pg_backend_pid()").Scan(&dataDir, &backend); err != nil {
		return 0, nil, fmt.Errorf("read the server's data_directory: %w (adaptbench needs a superuser or pg_read_all_settings)", err)
	}
	pidFile := filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, nil, fmt.Errorf("read %s: %w: adaptbench must run on the Postgres server's machine, as root", pidFile, err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, nil, fmt.Errorf("%s: first line %q is not a pid", pidFile, first)
	}
	if ppid, err := parentOf(backend); err != nil || ppid != postmaster {
		return 0, nil, fmt.Errorf("the backend of this connection (pid %d) is not a child of the postmaster %d of %s (parent %d, %v): is the server in another pid namespace or on another machine?", backend, postmaster, pidFile, ppid, err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(pid); err == nil && ppid == postmaster {
			children = append(children, pid)
		}
	}
	return postmaster, children, nil
}

// parentOf reads the parent pid of pid from /proc/pid/stat.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	return strconv.Atoi(f[1])
}
