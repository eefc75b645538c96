package testenv

import (
	"fmt"

	"github.com/batchmr/batchmr/internal/tests/cgroupcpu"
)

// LimitCPU caps the server's CPU at cores (0.5: half a core): it puts the
// postmaster and every process of the server in a cgroup v1 cpu group of
// the test's own (backends forked later join it too), weighted as the
// server's 32 busiest threads would be outside it, and sets its quota.
// Call it again to change the cap. The group is removed when the test
// ends. The test is skipped where there is no writable cgroup v1 cpu
// controller (root on a machine that mounts one: make test runs as root).
func (s *PostgresServer) LimitCPU(cores float64) {
	t := s.t
	t.Helper()
	if s.exited == nil {
		t.Fatal("testenv: LimitCPU: the server is not running")
	}
	if s.cpu == nil {
		if err := cgroupcpu.Check(); err != nil {
			t.Skipf("testenv: LimitCPU: %v", err)
		}
		g, err := cgroupcpu.New(fmt.Sprintf("batchmr-test-%d", s.port), 32)
		if err != nil {
			t.Fatalf("testenv: LimitCPU: %v", err)
		}
		t.Cleanup(func() { _ = g.Remove() })
		if err := g.AddTree(s.cmd.Process.Pid); err != nil {
			t.Fatalf("testenv: LimitCPU: %v", err)
		}
		s.cpu = g
	}
	if err := s.cpu.SetCores(cores); err != nil {
		t.Fatalf("testenv: LimitCPU: %v", err)
	}
}
