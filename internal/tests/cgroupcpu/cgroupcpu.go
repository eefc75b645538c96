// Package cgroupcpu caps a server's CPU for tests and benchmarks: a
// cgroup v1 cpu group of their own, a quota in cores, and the processes
// of a server moved into it and back. It needs root and a cpu controller
// mounted at Root.
package cgroupcpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Root is where the cgroup v1 cpu controller is mounted.
const Root = "/sys/fs/cgroup/cpu"

// period is the CFS period (µs) that quotas are shares of.
const period = 100000

// maxShares is the largest cpu.shares of cgroup v1.
const maxShares = 262144

// A Group is a cpu group under Root.
type Group struct{ dir string }

// Check returns an error naming the fix when groups cannot be made here.
func Check() error {
	if _, err := os.Stat(filepath.Join(Root, "cgroup.procs")); err != nil {
		return fmt.Errorf("no cgroup v1 cpu controller at %s (%v): mount one (Linux, cgroup v1)", Root, err)
	}
	if err := syscall.Access(Root, 2); err != nil {
		return fmt.Errorf("%s is not writable (%v): run as root", Root, err)
	}
	return nil
}

// New makes the group name with the CPU weight of threads busy threads
// of the root group: a group's weight (cpu.shares) counts as one thread's
// there, so at the default its processes would lose CPU to every other
// busy thread of the machine, and the quota would not be their capacity.
// Call Check first for an error that names the fix.
func New(name string, threads int) (*Group, error) {
	g := &Group{dir: filepath.Join(Root, name)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", g.dir, err)
	}
	if err := errors.Join(g.write("cpu.cfs_period_us", period), g.write("cpu.shares", min(1024*max(threads, 1), maxShares))); err != nil {
		_ = os.Remove(g.dir)
		return nil, err
	}
	return g, nil
}

// Dir is the group's directory.
func (g *Group) Dir() string { return g.dir }

// SetCores caps the group at cores (0.5: half a core).
func (g *Group) SetCores(cores float64) error {
	return g.write("cpu.cfs_quota_us", max(int(cores*period), 1000))
}

// Add moves the process pid, all its threads, into the group; a process
// that has exited is no error.
func (g *Group) Add(pid int) error {
	if err := g.write("cgroup.procs", pid); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// AddTree moves pid and its children into the group: a server's, whose
// later children then join it too.
func (g *Group) AddTree(pid int) error {
	errs := []error{g.Add(pid)}
	for _, kid := range ChildrenOf(pid) {
		errs = append(errs, g.Add(kid))
	}
	return errors.Join(errs...)
}

func (g *Group) write(file string, v int) error {
	if err := os.WriteFile(filepath.Join(g.dir, file), []byte(strconv.Itoa(v)), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: write %s=%d: %w", g.dir, file, v, err)
	}
	return nil
}

// Remove moves every process of the group back to the root group and
// removes the group. It retries briefly: a child forked while the
// processes move lands in the group after the listing.
func (g *Group) Remove() error {
	var errs []error
	for range 20 {
		b, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		for _, pid := range strings.Fields(string(b)) {
			// A process that exited meanwhile is gone from the group anyway.
			if err := os.WriteFile(filepath.Join(Root, "cgroup.procs"), []byte(pid), 0o644); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("move pid %s back to %s: %w", pid, Root, err))
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

// ChildrenOf lists the processes whose parent is pid.
func ChildrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := ParentOf(p); err == nil && ppid == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

// ParentOf reads the parent of pid from /proc/pid/stat.
func ParentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	var f []string
	if i >= 0 {
		f = strings.Fields(string(b[i+1:]))
	}
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	return strconv.Atoi(f[1])
}

// Procs lists the processes in the group.
func (g *Group) Procs() ([]int, error) {
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
