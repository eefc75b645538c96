package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

const permitsUsage = `scheduler permits get NAME | permits set NAME N: show or change a
fleet-wide semaphore. 'get' shows the limit, the permits held and by whom,
and who waits; 'set' changes the limit for every worker at once (raising it
wakes waiters now; lowering it lets holders finish and grants nobody until
the permits held fit).

Examples:
  scheduler permits get db
  scheduler permits set db 12

Flags:
`

func permits(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("permits", flag.ContinueOnError)
	url := redisFlag(fs)
	pos := parse(fs, permitsUsage, args)
	if len(pos) == 0 {
		app.Usage("missing get or set")
	}
	rdb, err := app.Redis(ctx, *url)
	if err != nil {
		app.Fail("%v", err)
	}
	defer rdb.Close()
	open := func(name string) *semaphore.Semaphore {
		// Limit 1 is never written: Redis keeps the fleet's own.
		s, err := app.Semaphore(rdb, name, semaphore.Options{Limit: 1})
		if err != nil {
			app.Usage("%v", err)
		}
		return s
	}
	switch pos[0] {
	case "get":
		want(pos, 2, 2, "NAME (the workers' database semaphore is \"db\")")
		s := open(pos[1])
		defer s.Close()
		st, err := s.Stats(ctx)
		if err != nil {
			app.Fail("%v", err)
		}
		if st.Limit == 0 {
			fmt.Printf("semaphore %s: no limit set yet (the first worker sets its --db-permits), held %d, %d waiting\n", pos[1], st.Held, len(st.Waiters))
		} else {
			fmt.Printf("semaphore %s: limit %d, held %d, %d waiting\n", pos[1], st.Limit, st.Held, len(st.Waiters))
		}
		if len(st.Holders)+len(st.Waiters) > 0 {
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "\tPROCESS\tWEIGHT\tFENCE\tFOR\tLEASE LEFT")
			for _, h := range st.Holders {
				fmt.Fprintf(w, "holds\t%s\t%d\t%d\t%s\t%s\n", h.Process, h.Weight, h.Fence, h.HeldFor.Round(time.Millisecond), h.LeaseLeft.Round(time.Millisecond))
			}
			for _, q := range st.Waiters {
				fmt.Fprintf(w, "waits\t%s\t%d\t\t%s\t\n", q.Process, q.Weight, q.Age.Round(time.Millisecond))
			}
			_ = w.Flush()
		}
	case "set":
		want(pos, 3, 3, "NAME and N")
		n, err := strconv.Atoi(pos[2])
		if err != nil || n < 1 {
			app.Usage("permits set %s %s: N must be a whole number of at least 1", pos[1], pos[2])
		}
		s := open(pos[1])
		defer s.Close()
		if err := s.SetLimit(ctx, n); err != nil {
			app.Fail("%v", err)
		}
		fmt.Printf("semaphore %s: limit %d\n", pos[1], n)
	default:
		app.Usage("permits %q: use get or set", pos[0])
	}
	return 0
}
