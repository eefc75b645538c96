// Package faults is batchmr's fault suite: it proves, against real servers
// it starts itself, that outages cost a run seconds, not the run (DESIGN
// M6). It holds no code of its own, only tests, and runs on Linux.
//
// Each scenario starts a deployment of its own: a Redis with AOF
// (testenv.PrivateRedisServer) and a Postgres (testenv.PrivatePostgres),
// a table of amounts, and three processes of the worker binary in
// testdata/sumworker — worker.Main with one job that sums the table page
// by page through pgsource.Fetch, built from public packages only and
// with the job's default options — each with --db-permits 3. A sampler
// reads pg_stat_activity every 10 ms on a connection of its own and counts
// the workers' active queries (by their application_name) that had
// started when the sample did: Postgres reads pg_stat_activity a backend
// at a time, so a query that started during the read may have taken the
// permit of one that ended during it, both listed. The test starts
// a run with the mapreduce Client, breaks something mid-run, and checks:
//
//   - the run succeeds, with the total that one SQL query gives;
//   - Postgres never saw more worker queries than permits;
//   - no permit is held once the run has ended (semaphore Stats);
//   - work resumed soon enough: the first worker query that Postgres saw
//     start after the fault ended;
//   - the run cost at most the fault plus 10 s (20 s for the database)
//     over an undisturbed run of the same size measured in the same test
//     process.
//
// The scenarios, and the bound each asserts:
//
//	Redis kill -9, restarted 3 s later (AOF)    resumes ≤ 2 s; costs ≤ outage + 10 s
//	Redis cut from the workers for 8 s          resumes ≤ 2 s; costs ≤ cut + 10 s
//	Redis blackholed for 8 s, pages of four     resumes ≤ 2 s; costs ≤ outage + 10 s;
//	  short permits each (carried enqueues)       ≥ 25 carrying calls
//	Redis down for 10 s (kill -9, AOF)          resumes ≤ 2 s; costs ≤ outage + 10 s
//	Postgres restarted (fast shutdown)          resumes ≤ 10 s; costs ≤ outage + 20 s
//	Postgres crashed and down for 60 s          resumes ≤ 10 s; costs ≤ outage + 20 s
//	runs of 30 s queries cancelled (three)      every query gone ≤ 2 s after each cancel
//	a permit holder paused (SIGSTOP) past its   permits handed on ≤ lease + 2 s;
//	  3 s lease, then continued (SIGCONT)       costs ≤ pause + 10 s
//	a worker whose clock ran 2 h fast killed    the run ends ≤ 3 min after the kill
//	tasks no step can run in a job's queue      archived ≤ 3 s, no retry, short error
//	the Sentinel primary killed (kill -9), its  ends ≤ failover + 10 s, no page failed,
//	  replica promoted (a Sentinel deployment)    no worker exits, `scheduler run
//	                                              --wait` follows it to its end
//	a Cluster primary killed (kill -9), its     as for Sentinel, twice: the primary of
//	  replica promoted (three primaries and       the run's records and the "db"
//	  a replica each)                             semaphore, then that of the job's queue
//
// and every scenario checks the permits, and every run it does not cancel
// its exact result. Each test logs what it measured (t.Logf: run -v), for
// docs/operations.md.
//
// The suite takes a few minutes: the 60 s outage is inherent. Scenarios
// that only wait run in parallel; those whose timing bounds others would
// distort run alone. make test runs the two kinds as two processes at once
// (BATCHMR_FAULTS=timed and =waiting); unset, one process runs both.
// -short skips it. make chaos soaks it:
// BATCHMR_CHAOS_REPEAT runs each scenario that many times, and
// BATCHMR_CHAOS_PAGES sets the pages of a run (400 by default; the
// campaign that found the faults used 2,500).
package faults
