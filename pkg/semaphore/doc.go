// Package semaphore is a fleet-wide, fair, blocking counting semaphore kept
// in Redis. Every process that opens the same semaphore shares its permits,
// so a whole fleet of workers can be held to N concurrent queries against a
// database, however many processes and goroutines it runs.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	sem, err := semaphore.New(rdb, "db", semaphore.Options{Limit: 8})
//	if err != nil {
//		return err
//	}
//	defer sem.Close()
//
//	err = sem.Do(ctx, func(ctx context.Context) error {
//		_, err := pool.Exec(ctx, query) // cancelled if the permit is lost
//		return err
//	})
//
// For Postgres queries, pgsource.Do (package
// github.com/batchmr/batchmr/pkg/mapreduce/pgsource) is the stronger form:
// it gives the permit back only once the server has dropped the query,
// where sem.Do gives it back when pgx returns, which a cancelled query
// does while the server may still run it.
//
// Waiters are served in the order they asked, across the fleet (FIFO), and a
// weighted request at the head of the queue is not overtaken by lighter ones.
// A release hands the permit to the next waiter at once: Redis records the
// waiter as the new holder and wakes its process, so nobody polls and nobody
// races for a freed permit. Once it has waited or held, a process keeps one
// blocking Redis connection per semaphore, however many goroutines wait.
// Under saturation a process's new waiters ride in its releases (a waiter
// that arrives while a release of its process is on its way, behind another
// of its waiters, is queued by the next release, or by one call for all
// such waiters once the release returns), so that many grants cost Redis
// one call, not two.
//
// A Redis outage costs seconds, not leases: calls that fail because Redis
// is unreachable, restarting or failing over are retried with backoff, a
// release among them (Release does not wait for it), and when Redis answers
// again every process refreshes at once, so that waiters are granted and
// holders whose permits Redis lost are told within moments.
//
// Permits are leases. While a permit is held, its process refreshes the lease
// in the background; a process that crashes gives its permits back when
// their leases run out (Options.Lease, 30s by default), and its waiters give
// up their places just as soon. A holder that loses its lease — its process
// was paused, or cut off from Redis, for longer than the lease — has its
// Permit's context cancelled with cause ErrLeaseLost, and Release reports
// ErrLeaseLost: its work may have overlapped with the next holder's. Each
// grant carries a fence (Permit.Fence) that is larger than every earlier
// grant's, which a downstream store can use to reject late writes.
//
// The limit lives in Redis. Options.Limit only sets it when Redis has none;
// SetLimit changes it for the whole fleet at once, and a raised limit wakes
// waiters immediately; Limit reads it, and tells whether Redis holds one
// (a Redis that lost it gets the next caller's Options.Limit). Stats shows
// who holds and who waits.
//
// All of a semaphore's keys share one Redis Cluster hash tag ("{name}"), and
// every state change is one Lua script that reads Redis's own clock, so the
// semaphore works on Redis Cluster and is immune to clock skew between hosts.
// See docs/semaphore.md for the algorithm, the keys and the failure modes.
package semaphore
