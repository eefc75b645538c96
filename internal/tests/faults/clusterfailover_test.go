//go:build linux

package faults_test

import (
	"testing"
)

// reqClusterFailoverCost is reqFailoverCost on a Cluster.
const reqClusterFailoverCost = "a run rides out a Cluster failover: it ends within the failover (cluster-node-timeout plus election) plus 10 s over an undisturbed run"

// A primary of a Redis Cluster (testenv.PrivateRedisClusterGroup: three
// primaries, a replica of each, cluster-node-timeout 1 s) killed with
// kill -9 mid-run: the one that holds the run's records and the "db"
// semaphore (records), or the one that holds the job's asynq queue
// (queue). Its replica is promoted, and the workers, the scheduler and
// the test's own clients, which know Redis by its Cluster URL, must find
// it within seconds rather than when their map of slots ages out (a
// minute). The run must end exact, with no page failed and no worker
// gone, at most the failover plus 10 s later than an undisturbed run;
// Postgres never runs more worker queries than permits, before the kill
// or after it. The test logs what the failover cost: its time, the
// records the promoted replica lacked, the worker queries run beyond one
// per page, the samples over the permits, and the tasks asynq still
// shows active (docs/operations.md says why the queue's leaves some).
func TestARunRidesOutAClusterFailoverOfThePrimaryOfItsRecordsOrOfItsQueue(t *testing.T) {
	timed(t)
	for _, sc := range []struct{ name, tag, holds string }{
		{"records", job, "the run's records and the db semaphore"},
		{"queue", queue, "the job's asynq queue"},
	} {
		t.Run(sc.name, func(t *testing.T) {
			soak(t, func(t *testing.T) { rideOutClusterFailover(t, sc.tag, sc.holds) })
		})
	}
}

// rideOutClusterFailover kills, mid-run, the primary that holds the keys
// of hash tag tag (holds says what they are) and checks the run rides it
// out.
func rideOutClusterFailover(t *testing.T, tag, holds string) {
	f := newFleet(t, fleetConfig{Cluster: true})
	a := defaultRun()
	base := f.baseline(a)
	p := f.cluster.PrimaryOf(t, tag)
	if tag == job {
		if q := f.cluster.PrimaryOf(t, "db"); q != p {
			t.Fatalf("the run's records are on primary %d and the db semaphore on %d: clusterTags must put them on one", p, q)
		}
	} else if q := f.cluster.PrimaryOf(t, job); q == p {
		t.Fatalf("the job's queue and the run's records are both on primary %d: clusterTags must keep them apart", p)
	}
	victim, replica := f.cluster.Primaries[p], f.cluster.Replicas[p]
	sched, before, synced := f.runAQuarter(a, victim)
	id := sched.id
	if tag == job && synced == 0 {
		t.Errorf("no write of the run waited for the replica before the kill: the ledger's writes must (WAIT 1)")
	}
	t.Logf("the victim, primary %d, holds %s; %d round trips to it waited for its replica before the kill", p, holds, synced)
	killed, promoted := f.failOver(id, before.Done, "the Cluster", victim, replica)

	f.checkRodeOut(sched, a, base, killed, promoted, reqClusterFailoverCost)
}
