// Package pgsource pages a Postgres table for pkg/mapreduce: Split cuts a
// table into keyset ranges in one pass over its ordered key, and Fetch reads
// one page while holding a permit of the fleet-wide semaphore — only while
// the query runs, never while the caller processes the rows. It lives in its
// own package so that users who do not use Postgres do not import pgx.
//
//	Split: func(ctx context.Context, a Args, emit func(pgsource.KeyRange) error) error {
//		return pgsource.Split(ctx, pool, sem, pgsource.Table{Name: "orders", Key: "id", PageSize: 5000}, emit)
//	},
//	Map: func(ctx context.Context, r pgsource.KeyRange) (Total, error) {
//		rows, err := pgsource.Fetch(ctx, pool, sem, `SELECT amount FROM orders WHERE id > $1 AND id <= $2`, r,
//			pgx.RowTo[int64])
//		...
//	},
//
// Split needs an integer key. A table keyed by a uuid, text or any other
// type Postgres orders pages with SplitSpans, whose KeySpan pages hold
// their first and last keys, both included:
//
//	Split: func(ctx context.Context, a Args, emit func(pgsource.KeySpan) error) error {
//		return pgsource.SplitSpans(ctx, pool, sem, pgsource.Table{Name: "events", Key: "id", PageSize: 5000}, emit)
//	},
//	Map: func(ctx context.Context, s pgsource.KeySpan) (Total, error) {
//		rows, err := pgsource.Fetch(ctx, pool, sem, `SELECT amount FROM events WHERE id BETWEEN $1 AND $2`, s,
//			pgx.RowTo[int64])
//		...
//	},
//
// A random key (a UUIDv4) scatters each page's rows over the whole table,
// so a page reads more of the heap than one of an integer or time-ordered
// key (UUIDv7) would: page by such a key where the table has one.
//
// Keyset pages cost the same wherever they are in the table: each is an
// index range scan. OFFSET pages (SplitOffset, OffsetRange) re-read every
// row before their offset, which makes a whole job quadratic; use them only
// for a table without an ordered unique key. BENCHMARKS.md measures both.
//
// # Permits and cancelled queries
//
// Postgres never runs more of the fleet's queries than the semaphore has
// permits, also when runs are cancelled, leases lost or workers stopped: a
// permit goes back only once its query is gone from the server, not when
// pgx returns (which it does at once when the context is done, while the
// server may still be running the query). Every function here works so,
// and Do gives the same guarantee to queries of one's own:
//
//	err := pgsource.Do(ctx, pool, sem, func(ctx context.Context, conn *pgx.Conn) error {
//		_, err := conn.Exec(ctx, `UPDATE orders SET archived = true WHERE id > $1 AND id <= $2`, r.Lo, r.Hi)
//		return err
//	})
//
// A query made on the pool directly, outside Do, has no such guarantee. For
// a pool of one's own, ConfigurePool makes cancelling cheaper (see there);
// a worker's pool has it already. Close the pool before the semaphore when
// shutting down, as a worker does: Semaphore.Close gives back every permit
// still held at once, queries or not.
//
// Do reports how its function ended with the permit, for the semaphore's
// controller in auto mode (semaphore.RunController); NewProbe gives the
// controller a probe of the server's spare CPU. A worker does both.
package pgsource
