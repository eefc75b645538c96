package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cpuCgroups is where the cgroup v1 cpu controller is mounted.
const cpuCgroups = "/sys/fs/cgroup/cpu"

// LimitCPU caps the server's CPU at cores (0.5: half a core): it puts the
// postmaster and every process of the server in a cgroup v1 cpu group of
// the test's own (backends forked later join it too) and sets its quota.
// Call it again to change the cap. The group is removed when the test
// ends. The test is skipped where there is no writable cgroup v1 cpu
// controller (root on a machine that mounts one: make test runs as root).
func (s *PostgresServer) LimitCPU(cores float64) {
	t := s.t
	t.Helper()
	if s.exited == nil {
		t.Fatal("testenv: LimitCPU: the server is not running")
	}
	group := filepath.Join(cpuCgroups, fmt.Sprintf("batchmr-test-%d", s.port))
	if _, err := os.Stat(group); os.IsNotExist(err) {
		if err := os.Mkdir(group, 0o755); err != nil {
			t.Skipf("testenv: LimitCPU needs a writable cgroup v1 cpu controller at %s (root): %v", cpuCgroups, err)
		}
		t.Cleanup(func() {
			// Back to the root group first: a group with processes cannot go.
			for _, pid := range readProcs(filepath.Join(group, "cgroup.procs")) {
				_ = os.WriteFile(filepath.Join(cpuCgroups, "cgroup.procs"), []byte(pid), 0)
			}
			_ = os.Remove(group)
		})
		must := func(err error) {
			if err != nil {
				t.Fatalf("testenv: LimitCPU: %v", err)
			}
		}
		must(os.WriteFile(filepath.Join(group, "cpu.cfs_period_us"), []byte("100000"), 0))
		pid := s.cmd.Process.Pid
		for _, p := range append([]int{pid}, childrenOf(pid)...) {
			// A process that has exited meanwhile cannot move: no matter.
			_ = os.WriteFile(filepath.Join(group, "cgroup.procs"), []byte(strconv.Itoa(p)), 0)
		}
	}
	quota := max(int(cores*100000), 1000)
	if err := os.WriteFile(filepath.Join(group, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quota)), 0); err != nil {
		t.Fatalf("testenv: LimitCPU: setting the quota: %v", err)
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if f := strings.Fields(string(stat[i+1:])); i > 0 && len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, p)
		}
	}
	return kids
}

// readProcs reads a cgroup.procs file: one PID a line.
func readProcs(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Fields(string(b))
}
