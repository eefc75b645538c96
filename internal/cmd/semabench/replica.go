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

	type side struct {
		name   string
		rdb    *redis.Client
		pairs  []time.Duration
		hands  []time.Duration
		a, b   *semaphore.Semaphore
		waited int64
	}
	sides := []*side{{name: "no replica", rdb: alone.rdb}, {name: "one replica", rdb: primary.rdb}}
	for _, sd := range sides {
		sd.a = newSem(sd.rdb, prefix, 1)
		defer sd.a.Close()
		brdb := redis.NewClient(sd.rdb.Options())
		defer brdb.Close()
		sd.b = newSem(brdb, prefix, 1)
		defer sd.b.Close()
		p, err := sd.a.Acquire(ctx) // the handle's first call looks for replicas
		must(err)
		must(p.Release(ctx))
	}
	for r := 0; r < *rounds; r++ {
		for _, sd := range sides {
			for i := 0; i < *perRound/4; i++ {
				t := time.Now()
				p, err := sd.a.Acquire(ctx)
				must(err)
				must(p.Release(ctx))
				sd.pairs = append(sd.pairs, time.Since(t))
			}
			for i := 0; i < *handoffs / *rounds; i++ {
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
				sd.hands = append(sd.hands, (<-got).Sub(t))
			}
		}
	}
	for _, sd := range sides {
		info, err := sd.rdb.Info(ctx, "commandstats").Result()
		must(err)
		sd.waited = commandCalls(info, "wait")
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

// commandCalls is the calls count of cmd in INFO commandstats.
func commandCalls(info, cmd string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			return n
		}
	}
	return 0
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
