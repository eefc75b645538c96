// Package metrics exports batchmr's Prometheus metrics: what this process
// does (an Observer for its semaphores and its mapreduce Client) and what
// the whole fleet looks like, read from Redis at scrape time (a Fleet
// collector), so that one scrape target shows every semaphore's queue,
// its auto mode (bounds, the controller's N and last window:
// batchmr_semaphore_auto_*, absent in fixed mode) and every active run. docs/metrics.md lists every series with its labels and
// example alerts. A job's name is the label batchmr_job, not job:
// Prometheus gives every series a job label of its own, the scrape job's.
//
// A worker started with worker.Main or worker.Run serves them on
// --metrics-addr; a process of your own wires them up like this:
//
//	obs := metrics.NewObserver()
//	sem, _ := semaphore.New(rdb, "db", semaphore.Options{Limit: 8, Observer: obs})
//	mr, _ := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Observer: obs})
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(obs, metrics.NewFleet(mr, []*semaphore.Semaphore{sem}, metrics.FleetOptions{}))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The core packages (semaphore, mapreduce) import no metrics library: they
// call the Observer interfaces that this package implements.
package metrics
