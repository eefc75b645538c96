//go:build linux

package faults_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
)

// The requirements of a run through a failover of its Redis.
const (
	reqFailoverCost   = "a run rides out a failover: it ends within the failover (the Sentinels' down-after plus election) plus 10 s over an undisturbed run"
	reqFailoverPages  = "no page fails for a failover"
	reqFailoverAlive  = "no worker exits for a failover"
	reqFailoverFollow = "scheduler run --wait follows a run through a failover and exits 0 with its result"
	failoverCost      = 10 * time.Second
	failoverPromotion = 30 * time.Second // the Sentinels promote the replica within this, or the scenario is broken
)

// The primary of a Sentinel deployment (testenv.PrivateSentinels: a
// replica, three Sentinels, down-after 1 s) killed with kill -9 mid-run:
// the Sentinels promote the replica, and the workers and the test's own
// clients, which know Redis by its Sentinels' URL, follow. Replication is
// asynchronous: what the dead primary had not sent on is lost. The run
// must end exact, with no page failed and no worker gone, at most the
// failover plus 10 s later than an undisturbed run; Postgres never runs
// more worker queries than permits, before the kill or after it (the
// semaphore's grants wait for a replica). The test logs what the failover cost: its
// time, the ledger's records the promoted replica lacked, the worker
// queries run beyond one per page, and the samples over the permits.
func TestARunRidesOutASentinelFailoverOfItsRedisAndEndsExact(t *testing.T) {
	timed(t)
	soak(t, func(t *testing.T) {
		f := newFleet(t, fleetConfig{Sentinel: true})
		a := defaultRun()
		base := f.baseline(a)
		sched, before, synced := f.runAQuarter(a, f.redis)
		id := sched.id
		if synced == 0 {
			t.Errorf("no write of the run waited for the replica before the kill: the ledger's writes must (WAIT 1)")
		}
		t.Logf("%d round trips of the run's writes waited for the replica before the kill", synced)
		killed, promoted := f.failOver(id, before.Done, "the Sentinels", f.redis, f.group.Replica)

		f.checkRodeOut(sched, a, base, killed, promoted, reqFailoverCost)
	})
}

// checkRodeOut checks the end of a run, followed by sched, through a
// failover that killed a primary at killed and promoted its replica at
// promoted: the run ends exact by the failover plus req's bound over base
// (req names the bound), with no page failed, scheduler run --wait
// following it to its end; no permit is held after it and no worker has
// exited; Postgres never ran more worker queries than permits, before the
// kill or after it. It logs what the failover cost.
func (f *fleet) checkRodeOut(sched *followed, a runArgs, base time.Duration, killed, promoted time.Time, req string) {
	t := f.t
	t.Helper()
	failover := promoted.Sub(killed)
	st := f.finish(sched.id, a, promoted.Add(base+failoverCost+5*time.Second), req)
	sched.check(f, st)
	if st == nil {
		f.checkAlive()
		return
	}
	if st.Failed > 0 {
		t.Errorf("%s: %d pages failed: %s", reqFailoverPages, st.Failed, describe(st))
	}
	ended := st.Finished
	t.Logf("the run ended %v after the kill", ended.Sub(killed).Round(time.Millisecond))
	if first, ok := f.sampler.firstStartAfter(promoted); ok {
		t.Logf("the first worker query after the promotion started %v after it", first.Sub(promoted).Round(time.Millisecond))
	}
	f.checkCost(st, base, failover, failoverCost, req)
	f.checkPermitsFree(ended)
	f.checkAlive()

	seen := f.sampler.startsBetween(st.Created, ended)
	t.Logf("Postgres saw %d worker queries start for the run's %d pages (%d beyond one a page; the sampler may miss a few)", seen, a.pages(f), seen-a.pages(f))
	// A task whose outcome asynq failed to write during the failover
	// stays active until asynq's recoverer, a minute or two on
	// (docs/asynq-sync-retry.md). On a Cluster, a task that ends soon
	// after a node failed waits for its queue's primary before it
	// returns, so that only tasks that returned in the moment between the
	// kill and the first failure seen stay so, not every task held at
	// the kill (30 here).
	const leftActive = 5
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	var qi *asynq.QueueInfo
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("at most %d tasks of the run's queue to be active 10 s after the run", leftActive), func() bool {
		var err error
		qi, err = insp.GetQueueInfo(queue)
		return err == nil && qi.Active <= leftActive
	})
	t.Logf("asynq after the run: %d archived, %d retry, %d active, %d pending; processed %d, failed %d today", qi.Archived, qi.Retry, qi.Active, qi.Pending, qi.Processed, qi.Failed)

	// S1 as Postgres sees it, before the kill and after it.
	most, at := f.sampler.maximum()
	t.Logf("Postgres ran at most %d worker queries at once (permits %d)", most, permits)
	n, d, first := f.sampler.over(permits, killed)
	if n > 0 {
		t.Logf("after the kill, %d samples saw more worker queries than permits, for %v in all, the first %v after the kill",
			n, d.Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond))
	} else {
		t.Logf("after the kill, no sample saw more worker queries than permits")
	}
	switch {
	case most > permits && at.Before(killed):
		t.Errorf("%s: Postgres ran %d worker queries at once at %s, before the failover, with %d permits; %s", reqPermits, most, at.Format("15:04:05.000"), permits, f.sampler.overDetail())
	case n > 0:
		t.Errorf("%s: after the failover, %d samples saw more worker queries than permits, for %v in all; %s", reqPermits, n, d.Round(time.Millisecond), f.sampler.overDetail())
	case most == 0:
		t.Errorf("the sampler saw no worker query in pg_stat_activity (application_name %s)", f.app)
	}
}

// followed is a run started, and followed to its end, by
// `scheduler run --wait`, as an operator's script starts one.
type followed struct {
	id     string
	cmd    *exec.Cmd
	stdout bytes.Buffer // what it printed after the run's ID
	stderr testenv.LogBuffer
	exited chan struct{}
}

// startFollowed starts run a with `scheduler run --wait` and returns once
// it has printed the run's ID.
func (f *fleet) startFollowed(a runArgs) *followed {
	f.t.Helper()
	b, _ := json.Marshal(a)
	r := &followed{exited: make(chan struct{})}
	r.cmd = exec.Command(binaries.Build(f.t, "../../../cmd/scheduler"), "run", a.job(), "--args", string(b), "--wait")
	r.cmd.Env = f.env
	r.cmd.Stderr = &r.stderr
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.exited
	})
	lines := bufio.NewReader(out)
	id, err := lines.ReadString('\n')
	if err != nil {
		_ = r.cmd.Process.Kill()
		f.t.Fatalf("scheduler run printed no run ID (%v): %s", err, r.stderr.String())
	}
	r.id = strings.TrimSpace(id)
	go func() {
		_, _ = io.Copy(&r.stdout, lines)
		_ = r.cmd.Wait()
		close(r.exited)
	}()
	return r
}

// check fails the test unless the scheduler exits 0 within 10 s of the
// run's end, having printed the run's result.
func (r *followed) check(f *fleet, st *mapreduce.Status) {
	f.t.Helper()
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		f.t.Errorf("%s: it had not exited 10 s after the run ended; its stderr:\n%s", reqFailoverFollow, r.stderr.Tail(20))
		return
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 || st == nil || !strings.Contains(r.stdout.String(), `"sum":`) {
		f.t.Errorf("%s: it exited %d, printing %q; its stderr:\n%s", reqFailoverFollow, code, r.stdout.String(), r.stderr.Tail(20))
		return
	}
	f.t.Logf("scheduler run --wait followed the run through the failover and exited 0; it said:\n%s", r.stderr.Tail(6))
}

// checkAlive fails the test if a worker has exited, showing why.
func (f *fleet) checkAlive() {
	f.t.Helper()
	for i, w := range f.workers {
		select {
		case <-w.exited:
			f.t.Errorf("%s: worker %d exited (%v); the end of its log:\n%s", reqFailoverAlive, i, w.cmd.ProcessState, w.out.Tail(20))
		default:
		}
	}
}

// failOver kills victim (kill -9) mid-run id, and returns when replica is
// promoted (by who: the Sentinels, the Cluster) and the test's client
// reads the run from the new primary, logging how long the promotion took
// and the run's recorded pages before the kill (done) and after it. The
// sampler watches Postgres closely meanwhile: permits change hands in a
// burst.
func (f *fleet) failOver(id string, done int, who string, victim, replica *testenv.RedisServer) (killed, promoted time.Time) {
	f.t.Helper()
	ctx := context.Background()
	killed = time.Now()
	victim.Kill()
	f.follow(id)
	testenv.WaitFor(f.t, failoverPromotion, who+" to promote the replica", func() bool {
		role, err := replica.Client.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	})
	promoted = time.Now()
	f.sampler.watchClosely(5 * time.Second)
	var kept int
	testenv.WaitFor(f.t, 10*time.Second, "the test's client to reach the new primary", func() bool {
		st, err := f.mr.Status(ctx, id)
		if err == nil {
			kept = st.Done
		}
		return err == nil
	})
	f.t.Logf("%s promoted the replica %v after the kill; the run had %d pages recorded before it, the new primary %d (%d lost)",
		who, promoted.Sub(killed).Round(time.Millisecond), done, kept, max(done-kept, 0))
	return killed, promoted
}

// runAQuarter starts run a, followed by scheduler run --wait, and returns
// once a quarter of its pages are recorded, with the run's status then and
// how many round trips to victim, a primary, waited for its replica
// meanwhile (WAIT 1 1000, which follows the synced writes on their
// connection).
func (f *fleet) runAQuarter(a runArgs, victim *testenv.RedisServer) (*followed, *mapreduce.Status, int32) {
	f.t.Helper()
	var synced atomic.Int32
	stop := testenv.Monitor(f.t, "tcp", victim.Client.Options().Addr, func(line string) {
		if strings.Contains(line, `"WAIT" "1" "1000"`) || strings.Contains(line, `"wait" "1" "1000"`) {
			synced.Add(1)
		}
	})
	sched := f.startFollowed(a)
	f.waitDone(sched.id, a.pages(f)/4)
	before, err := f.mr.Status(context.Background(), sched.id)
	if err != nil {
		f.t.Fatal(err)
	}
	stop()
	return sched, before, synced.Load()
}
