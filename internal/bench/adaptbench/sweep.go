package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"
)

// sweepResult is what each fixed limit did at each capacity.
type sweepResult struct {
	caps  []capacity
	ns    []int
	w     [][]window // [capacity][limit]
	nstar []int      // per capacity
	best  []int      // per capacity: the N of the highest throughput
}

// at returns what limit n did at capacity ci.
func (r *sweepResult) at(ci, n int) window { return r.w[ci][slices.Index(r.ns, n)] }

// sweep measures each fixed limit of ns at full, then at reduced
// capacity: the limits rise at full and fall at reduced, so that the
// queries begun before a change, which it waits out, end soon.
func (b *bench) sweep(ctx context.Context, ns []int) (*sweepResult, error) {
	r := &sweepResult{caps: []capacity{b.full, b.reduce}, ns: ns}
	for ci, c := range r.caps {
		r.w = append(r.w, make([]window, len(ns)))
		if err := b.group.SetCores(c.cores()); err != nil {
			return nil, err
		}
		order := slices.Clone(ns)
		if ci == 1 {
			slices.Reverse(order)
		}
		for _, n := range order {
			if err := b.sem.SetLimit(ctx, n); err != nil {
				return nil, err
			}
			if err := b.load.waitBegunBefore(ctx, time.Now()); err != nil {
				return nil, err
			}
			if err := sleep(ctx, *warmup); err != nil {
				return nil, err
			}
			from, cpu := time.Now(), b.cpuNow(ctx)
			if err := sleep(ctx, *step); err != nil {
				return nil, err
			}
			to := time.Now()
			w := b.load.window(from, to)
			w.pgCores, w.otherCores = b.cpuNow(ctx).cores(cpu, to.Sub(from))
			r.w[ci][slices.Index(ns, n)] = w
			fmt.Fprintf(os.Stderr, "adaptbench: %s, N=%d: %.1f q/s, p50 %.0f ms, p99 %.0f ms; CPU: Postgres %.2f, others %.2f\n",
				c.name, n, w.throughput, ms(w.p50), ms(w.p99), w.pgCores, w.otherCores)
		}
		best := 0
		for i := range ns {
			if r.w[ci][i].throughput > r.w[ci][best].throughput {
				best = i
			}
		}
		r.best = append(r.best, ns[best])
		for i, n := range ns {
			if r.w[ci][i].throughput >= (1-*nStarWithin)*r.w[ci][best].throughput {
				r.nstar = append(r.nstar, n)
				break
			}
		}
	}
	return r, nil
}

func (r *sweepResult) print() {
	fmt.Printf("## Fixed limits: %v measured after %v of warm-up\n\n", *step, *warmup)
	fmt.Print("| N |")
	for _, c := range r.caps {
		fmt.Printf(" %s: q/s | p50 | p99 | CPU: Postgres / others |", c)
	}
	fmt.Println()
	fmt.Print("|---|")
	for range r.caps {
		fmt.Print("---|---|---|---|")
	}
	fmt.Println()
	for i, n := range r.ns {
		fmt.Printf("| %d |", n)
		for ci := range r.caps {
			w := r.w[ci][i]
			mark := ""
			if n == r.nstar[ci] {
				mark = " (N*)"
			}
			fmt.Printf(" %.1f%s | %.0f ms | %.0f ms | %.2f / %.2f |", w.throughput, mark, ms(w.p50), ms(w.p99), w.pgCores, w.otherCores)
		}
		fmt.Println()
	}
	fmt.Println()
	fmt.Println("CPU: the cores Postgres used on average, and those the machine's other processes used beside it (not Redis, not this benchmark): other load competing with the run.")
	fmt.Println()
	fmt.Printf("N* of a capacity: the smallest N whose throughput is within %.0f%% of that capacity's best.", *nStarWithin*100)
	for ci, c := range r.caps {
		fmt.Printf(" %s: N* = %d (best %.1f q/s at N = %d).", c.name, r.nstar[ci], r.at(ci, r.best[ci]).throughput, r.best[ci])
	}
	fmt.Print("\n\n")
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
