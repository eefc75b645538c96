package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/batchmr/batchmr/internal/tests/cgroupcpu"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cfsPeriod is the period, in µs, that the quotas below are shares of.
const cfsPeriod = 100000

// A capacity is a CPU quota for the Postgres server.
type capacity struct {
	name  string
	quota int // µs of CPU per cfsPeriod
}

// cores is the quota in cores.
func (c capacity) cores() float64 { return float64(c.quota) / cfsPeriod }

func (c capacity) String() string {
	return fmt.Sprintf("%s (%.1f cores)", c.name, float64(c.quota)/cfsPeriod)
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
	if ppid, err := cgroupcpu.ParentOf(backend); err != nil || ppid != postmaster {
		return 0, nil, fmt.Errorf("the backend of this connection (pid %d) is not a child of the postmaster %d of %s (parent %d, %v): is the server in another pid namespace or on another machine?", backend, postmaster, pidFile, ppid, err)
	}
	children = cgroupcpu.ChildrenOf(postmaster)
	return postmaster, children, nil
}
