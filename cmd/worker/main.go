// Command worker runs batchmr's bundled example job, orders-report
// (examples/pagination), on the public worker runtime: a worker of your own
// jobs is the same one line with your jobs instead (docs/first-job.md).
// 'worker --help' lists its flags and environment variables.
package main

import (
	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/pkg/worker"
)

// orders-report queries Postgres: a worker without a database refuses to
// start rather than fail the pages it would take.
func main() {
	worker.MainWith(func(cfg *worker.Config) { cfg.RequireDatabase = true }, ordersreport.Job)
}
