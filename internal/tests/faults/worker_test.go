//go:build linux

package faults_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// A worker that holds a permit is paused (SIGSTOP) past its lease, then
// continues (SIGCONT). While it is paused its permits go to the rest of the
// fleet within the lease plus a check interval (DESIGN S3), and work goes
// on; when it continues, it must not run a query on a permit it has lost:
// Postgres never sees more worker queries than permits. The pause, an
// outage of one worker, costs the run at most its length plus 10 s.
func TestAPermitHolderPausedPastItsLeaseLosesItsPermitsAndNeverOverrunsThemWhenItContinues(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		const lease = 3 * time.Second
		f := newFleet(t, fleetConfig{Lease: lease})
		// 300 pages of 100 ms, so that the rest of the fleet is still busy
		// with all the permits when the paused worker continues.
		a := runArgs{PageSize: int(f.rows/300) + 1, SleepMS: 100}
		base := f.baseline(a)
		id := f.start(a)
		f.waitDone(id, a.pages(f)/10)
		w, holder := f.pauseAPermitHolder()
		paused := time.Now()

		// Its permits go to the rest of the fleet.
		handedOn := f.waitNoPermitOf(holder, paused.Add(time.Minute))
		d := handedOn.Sub(paused)
		t.Logf("the paused worker's permits were handed on %v after it was paused (lease %v)", d.Round(time.Millisecond), lease)
		if d > lease+2*time.Second {
			t.Errorf("a paused holder gives its permits back within its lease plus a check interval: it took %v with a lease of %v", d.Round(time.Millisecond), lease)
		}
		// It continues once the rest of the fleet has run a query on the
		// permits it lost.
		if !testenv.Eventually(time.Until(paused.Add(lease+3*time.Second)), func() bool { return f.sampler.startsBetween(handedOn, time.Now()) > 0 }) {
			t.Errorf("work goes on while a worker is paused: no worker query started in the %v after its permits were handed on",
				time.Since(handedOn).Round(time.Millisecond))
		}
		if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		continued := time.Now()
		f.sampler.watchClosely(5 * time.Second) // where a lost permit could be used
		// Besides the pages the paused worker has in hand (one per handler,
		// the worker's default --concurrency of 10), the rest of the fleet
		// must still have work, or a query it runs on a lost permit would
		// overlap nothing.
		if st, err := f.mr.Status(context.Background(), id); err == nil && st.Total-st.Done <= 10 {
			t.Errorf("the rest of the fleet had no page left when the paused worker continued (%s): the scenario proves nothing; use more pages", describe(st))
		}
		t.Logf("paused for %v", continued.Sub(paused).Round(time.Millisecond))

		st := f.finish(id, a, continued.Add(base+outageCost+5*time.Second), reqOutageCost)
		if st != nil && st.State.Ended() {
			t.Logf("the run ended %v after the paused worker continued", st.Finished.Sub(continued).Round(time.Millisecond))
			f.checkCost(st, base, continued.Sub(paused), outageCost, reqOutageCost)
			f.checkPermitsFree(st.Finished)
		}
		f.checkPermits()
	})
}

// killRecovery bounds how long a run may take to finish after one of its
// workers is killed, whatever that worker's clock wrote. No requirement
// bounds it; asynq itself hands a crashed worker's tasks on after one to
// three minutes with the default options (a 30 s lease, a 30 s allowance
// for clock skew, a recoverer pass a minute, a first retry after 15-45 s):
// a fast clock must cost no more than that.
const killRecovery = 3 * time.Minute

// A worker whose clock ran 2 h fast is killed mid-run: asynq's leases of
// its tasks, scored on its clock, lie 2 h in the future, so asynq would
// not hand its pages on for 2 h (F4: the run hung). The run must still
// finish, exact, with the two workers left.
func TestARunFinishesAfterAWorkerWhoseClockRanTwoHoursFastIsKilled(t *testing.T) {
	mostlyWaits(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{})
		a := defaultRun()
		id := f.start(a)
		f.waitDone(id, a.pages(f)/4)
		w := f.workers[0]
		if err := w.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-w.exited
		killed := time.Now()
		leases := f.fastForward(w.cmd.Process.Pid, 2*time.Hour)
		t.Logf("killed worker %d mid-run and moved %d asynq leases and its server entries 2 h ahead, as its clock would have written them",
			w.cmd.Process.Pid, leases)

		st := f.finish(id, a, killed.Add(killRecovery), fmt.Sprintf("a run finishes within %v of a worker's death, whatever its clock", killRecovery))
		if st != nil && st.State.Ended() {
			t.Logf("the run ended %v after the kill (bound %v)", st.Finished.Sub(killed).Round(time.Millisecond), killRecovery)
			// The dead worker's permits stay taken until their leases (30 s) end.
			f.checkPermitsFree(later(st.Finished, killed.Add(30*time.Second)))
		}
		f.checkPermits()
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// pauseAPermitHolder stops (SIGSTOP) a worker while it holds a permit of
// "db", and returns it with its process ID in the semaphore.
func (f *fleet) pauseAPermitHolder() (*workerProc, string) {
	f.t.Helper()
	ctx := context.Background()
	holds := func(process string) bool {
		st, err := f.sem.Stats(ctx)
		return err == nil && slices.ContainsFunc(st.Holders, func(h semaphore.Holder) bool { return h.Process == process })
	}
	var w *workerProc
	var process string
	if !testenv.Eventually(30*time.Second, func() bool {
		st, err := f.sem.Stats(ctx)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, h := range st.Holders {
			if w = f.workerOf(h.Process); w == nil {
				continue
			}
			if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				f.t.Fatal(err)
			}
			if holds(h.Process) {
				process = h.Process
				return true
			}
			_ = w.cmd.Process.Signal(syscall.SIGCONT) // it released meanwhile: try again
			return false
		}
		return false
	}) {
		f.t.Fatal("found no worker holding a permit to pause within 30s")
	}
	return w, process
}

// workerOf returns the worker whose semaphore process ID is process
// ("<host>-<pid>-<random>"), or nil.
func (f *fleet) workerOf(process string) *workerProc {
	rest := process[:max(strings.LastIndexByte(process, '-'), 0)]
	pid, err := strconv.Atoi(rest[strings.LastIndexByte(rest, '-')+1:])
	if err != nil {
		return nil
	}
	for _, w := range f.workers {
		if w.cmd.Process.Pid == pid {
			return w
		}
	}
	return nil
}

// waitNoPermitOf waits until process holds no permit of "db" and returns
// when it saw that, failing the test at deadline.
func (f *fleet) waitNoPermitOf(process string, deadline time.Time) time.Time {
	f.t.Helper()
	var st semaphore.Stats
	var err error
	if !testenv.Eventually(time.Until(deadline), func() bool {
		st, err = f.sem.Stats(context.Background())
		return err == nil && !slices.ContainsFunc(st.Holders, func(h semaphore.Holder) bool { return h.Process == process })
	}) {
		f.t.Fatalf("a paused holder gives its permits back within its lease plus a check interval: it still holds one at %s: %+v, %v",
			deadline.Format("15:04:05.000"), st.Holders, err)
	}
	return time.Now()
}

// fastForward rewrites what a worker with a clock ahead by skew writes on
// its clock into Redis: the lease of every task active in the job's queue
// (a live worker rewrites its own leases at its next heartbeat, within 5 s;
// a dead one never does), and the dead worker pid's entries in asynq's
// server and worker lists. It returns how many leases it moved.
func (f *fleet) fastForward(pid int, skew time.Duration) int {
	f.t.Helper()
	ctx := context.Background()
	rdb := f.redis.Client
	ahead := float64(time.Now().Add(skew).Unix()) // asynq scores in unix seconds
	leaseKey := "asynq:{" + queue + "}:lease"
	ids, err := rdb.ZRange(ctx, leaseKey, 0, -1).Result()
	if err != nil {
		f.t.Fatal(err)
	}
	if len(ids) == 0 {
		f.t.Fatalf("no task is active in %s: the worker was killed with nothing in hand", queue)
	}
	for _, id := range ids {
		if err := rdb.ZAddXX(ctx, leaseKey, redis.Z{Score: ahead, Member: id}).Err(); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, key := range []string{"asynq:servers", "asynq:workers"} {
		members, err := rdb.ZRange(ctx, key, 0, -1).Result()
		if err != nil {
			f.t.Fatal(err)
		}
		for _, m := range members {
			if strings.Contains(m, ":"+strconv.Itoa(pid)+":") {
				if err := rdb.ZAddXX(ctx, key, redis.Z{Score: ahead, Member: m}).Err(); err != nil {
					f.t.Fatal(err)
				}
			}
		}
	}
	return len(ids)
}
