package main_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/internal/tests/testenv/testhost"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/redis/go-redis/v9"
)

// The scheduler is built once per test binary, on first use, and removed
// by TestMain: one link per test would cost more than the tests.
var binaries testenv.Binaries

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	os.Exit(code)
}

func schedulerBinary(t *testing.T) string {
	t.Helper()
	return binaries.Build(t, ".")
}

// quiet is the logger of the test's own clients: errors only.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// fleet is one test's deployment: the test Redis under a key prefix no
// other test uses, workers the test runs in its own process, and a client
// that starts and inspects runs as any program would.
type fleet struct {
	t      *testing.T
	rdb    *redis.Client
	prefix string
	mr     *mapreduce.Client // runs no job
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, rdb: rdb, prefix: prefix, mr: mr}
}

// host runs jobs as a worker process does — an asynq server on the jobs'
// queues, and an announcement in the catalogue naming sems as the
// semaphores it uses — until stop is called or the test ends. It returns
// once the catalogue lists the worker.
func (f *fleet) host(sems []string, jobs ...mapreduce.AnyJob) (mapreduce.WorkerInfo, func()) {
	f.t.Helper()
	return testhost.Host(f.t, f.rdb, testhost.Options{Prefix: f.prefix, Semaphores: sems, Logger: quiet}, jobs...)
}

// sumArgs are the arguments of the tests' job.
type sumArgs struct {
	N        int `json:"n"`
	PageSize int `json:"page_size"`
}

// sumJob sums 1..N, PageSize numbers a page. When gate is not nil, every
// page waits for it to close (or for its run to be cancelled).
func sumJob(name string, gate <-chan struct{}) mapreduce.Job[sumArgs, [2]int, int, int] {
	return mapreduce.Job[sumArgs, [2]int, int, int]{
		Name: name,
		Validate: func(a sumArgs) error {
			if a.PageSize < 1 {
				return fmt.Errorf("page_size %d: use at least 1", a.PageSize)
			}
			return nil
		},
		Split: func(ctx context.Context, a sumArgs, emit func([2]int) error) error {
			for lo := 1; lo <= a.N; lo += a.PageSize {
				if err := emit([2]int{lo, min(lo+a.PageSize-1, a.N)}); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(ctx context.Context, p [2]int) (int, error) {
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			sum := 0
			for i := p[0]; i <= p[1]; i++ {
				sum += i
			}
			return sum, nil
		},
		Reduce: func(ctx context.Context, a sumArgs, pages iter.Seq2[mapreduce.PageResult[[2]int, int], error]) (int, error) {
			total := 0
			for pr, err := range pages {
				if err != nil {
					return 0, err
				}
				total += pr.Result
			}
			return total, nil
		},
	}
}

// gate holds a gated job's pages until opened; it opens when the test
// ends, before the workers stop, so that no page keeps a worker waiting.
func gate(t *testing.T) (<-chan struct{}, func()) {
	c := make(chan struct{})
	open := sync.OnceFunc(func() { close(c) })
	t.Cleanup(open)
	return c, open
}

// scheduler runs the built command against the fleet's Redis, under the
// fleet's prefix.
type scheduler struct {
	t   *testing.T
	bin string
	env []string
}

func newScheduler(t *testing.T, f *fleet) *scheduler {
	t.Helper()
	return &scheduler{t: t, bin: schedulerBinary(t), env: append(os.Environ(),
		"REDIS_URL="+testenv.RedisURL(t), "BATCHMR_PREFIX="+f.prefix, "LOG_FORMAT=text")}
}

// with returns a scheduler whose environment also has env (later
// settings win).
func (s *scheduler) with(env ...string) *scheduler {
	return &scheduler{t: s.t, bin: s.bin, env: append(slices.Clip(s.env), env...)}
}

// run runs the command to its end (at most 30s) and returns stdout,
// stderr and the exit code.
func (s *scheduler) run(args ...string) (string, string, int) {
	s.t.Helper()
	p := s.start(args...)
	code := p.wait(30 * time.Second)
	return p.stdout.String(), p.stderr.String(), code
}

// proc is the command running in the background.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr *testenv.LogBuffer
	done           chan struct{}
}

func (s *scheduler) start(args ...string) *proc {
	s.t.Helper()
	p := &proc{t: s.t, cmd: exec.Command(s.bin, args...), stdout: &testenv.LogBuffer{}, stderr: &testenv.LogBuffer{}, done: make(chan struct{})}
	p.cmd.Env = s.env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	s.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// interrupt sends the command SIGINT and fails the test unless it exits 0
// within timeout; it reports whether it did.
func (p *proc) interrupt(timeout time.Duration) bool {
	p.t.Helper()
	_ = p.cmd.Process.Signal(os.Interrupt)
	if code := p.wait(timeout); code != 0 {
		p.t.Errorf("%s after SIGINT: exit %d, stderr %q", p.cmd.Args[1], code, p.stderr)
		return false
	}
	return true
}

// wait waits for the command to exit and returns its exit code; it fails
// the test if the command runs past timeout.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("%v still running after %v; stdout %q, stderr %q", p.cmd.Args, timeout, p.stdout, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// lines splits output into its non-empty lines.
func lines(s string) []string {
	return slices.DeleteFunc(strings.Split(s, "\n"), func(l string) bool { return strings.TrimSpace(l) == "" })
}

// oneLine reports whether s is one line of text.
func oneLine(s string) bool {
	return strings.TrimSpace(s) != "" && !strings.Contains(strings.TrimSpace(s), "\n")
}

// state reads a run's state directly from Redis.
func (f *fleet) state(id string) mapreduce.State {
	st, err := f.mr.Status(context.Background(), id)
	if err != nil {
		if errors.Is(err, mapreduce.ErrRunNotFound) {
			return "not found"
		}
		f.t.Fatal(err)
	}
	return st.State
}
