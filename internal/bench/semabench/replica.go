package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batchmr/batchmr/internal/bench/benchutil"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// replicaCost: what waiting for a replica (WAIT) costs a grant. It starts
// two throwaway redis-servers of its own on loopback ports, one alone and
// one with a replica, and measures on both, interleaved in rounds, an
// uncontended Acquire+Release and a hand-off to another handle (Release
// called → the waiter's Acquire returns). Run it alone: -only replica.
func replicaCost(ctx context.Context, _ *redis.Client, prefix string) {
	dir, err := os.MkdirTemp("", "semabench-replica-")
	must(err)
	defer os.RemoveAll(dir)
	alone := startServer(dir, "alone")
	defer alone.stop()
	primary := startServer(dir, "primary")
	defer primary.stop()
	replica := startServer(dir, "replica", "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	defer replica.stop()
	for {
		info, _ := replica.rdb.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	sides := []*replicaSide{{name: "no replica", rdb: alone.rdb}, {name: "one replica", rdb: primary.rdb}}
	for _, sd := range sides {
		closeSide := sd.open(ctx, prefix)
		defer closeSide()
	}
	for r := 0; r < *rounds; r++ {
		for _, sd := range sides {
			for i := 0; i < *perRound/4; i++ {
				sd.pairs = append(sd.pairs, sd.pair(ctx))
			}
			for i := 0; i < *handoffs / *rounds; i++ {
				sd.hands = append(sd.hands, sd.handoff(ctx))
			}
		}
	}
	for _, sd := range sides {
		st, err := benchutil.CommandStats(ctx, sd.rdb)
		must(err)
		sd.waited = st["wait"].Calls
	}
	p50 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	ratio := func(a, b []time.Duration) float64 { return float64(p50(b)) / float64(p50(a)) }
	no, one := sides[0], sides[1]
	fmt.Printf("## Waiting for a replica (WAIT): per-operation medians, %d rounds interleaved\n\n", *rounds)
	fmt.Println("| operation | no replica | one replica | ratio |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| uncontended Acquire+Release (%d each) | %s | %s | **%.2f** |\n", len(no.pairs), fmtDur(p50(no.pairs)), fmtDur(p50(one.pairs)), ratio(no.pairs, one.pairs))
	fmt.Printf("| hand-off to another handle (%d each) | %s | %s | **%.2f** |\n", len(no.hands), fmtDur(p50(no.hands)), fmtDur(p50(one.hands)), ratio(no.hands, one.hands))
	fmt.Printf("| WAIT commands Redis ran | %d | %d | |\n\n", no.waited, one.waited)
}

// replicaSide is one server of the replica section, with two handles, a
// and b, on one semaphore, and what was measured on it.
type replicaSide struct {
	name   string
	rdb    *redis.Client
	pairs  []time.Duration // uncontended Acquire+Release
	hands  []time.Duration // hand-offs from a to b
	a, b   *semaphore.Semaphore
	waited int64 // WAIT commands the server ran
}

// open opens the side's handles, b on a client of its own, and returns
// what closes them.
func (sd *replicaSide) open(ctx context.Context, prefix string) (closeAll func()) {
	sd.a = newSem(sd.rdb, prefix, 1)
	brdb := redis.NewClient(sd.rdb.Options())
	sd.b = newSem(brdb, prefix, 1)
	closeAll = func() {
		sd.b.Close()
		brdb.Close()
		sd.a.Close()
	}
	p, err := sd.a.Acquire(ctx) // the handle's first call looks for replicas
	must(err)
	must(p.Release(ctx))
	return closeAll
}

// pair times an uncontended Acquire+Release.
func (sd *replicaSide) pair(ctx context.Context) time.Duration {
	t := time.Now()
	p, err := sd.a.Acquire(ctx)
	must(err)
	must(p.Release(ctx))
	return time.Since(t)
}

// handoff times a hand-off: from a's Release being called to b's waiting
// Acquire returning.
func (sd *replicaSide) handoff(ctx context.Context) time.Duration {
	p, err := sd.a.Acquire(ctx)
	must(err)
	got := make(chan time.Time, 1)
	go func() {
		q, err := sd.b.Acquire(ctx)
		must(err)
		got <- time.Now()
		must(q.Release(ctx))
	}()
	for { // wait, outside the measurement, until b is queued
		st, err := sd.a.Stats(ctx)
		must(err)
		if len(st.Waiters) == 1 {
			break
		}
	}
	t := time.Now()
	must(p.Release(ctx))
	return (<-got).Sub(t)
}

type server struct {
	cmd  *exec.Cmd
	port int
	rdb  *redis.Client
}

func startServer(dir, name string, args ...string) *server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	port := ln.Addr().(*net.TCPAddr).Port
	must(ln.Close())
	argv := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--dbfilename", name + ".rdb", "--logfile", dir + "/" + name + ".log"}, args...)
	c := exec.Command("redis-server", argv...)
	must(c.Start())
	s := &server{cmd: c, port: port, rdb: redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})}
	for s.rdb.Ping(context.Background()).Err() != nil {
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

func (s *server) stop() {
	_ = s.rdb.Close()
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}
