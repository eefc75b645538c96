package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batchmr/batchmr/internal/app"
	"github.com/batchmr/batchmr/internal/backoff"
	"github.com/batchmr/batchmr/internal/rediserr"
	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/robfig/cron/v3"
)

const serveUsage = `scheduler serve --schedule JOB=SPEC [--schedule ...] [--args JOB=JSON ...]:
start runs of any job of the catalogue on a schedule, until SIGTERM.

SPEC is a cron expression (5 fields, UTC; 'CRON_TZ=Europe/Berlin 0 6 * * *'
follows that zone's clock: a time that summer time skips has no tick that
day, and one it repeats ticks twice), a descriptor (@hourly, @daily, ...)
or '@every DURATION', which fires at multiples of the duration since
the Unix epoch. Each tick's run is named after the tick, so any number of
replicas can serve the same schedules: they start one run per tick. A tick
whose previous run of the job is still going is skipped (unless the job
allows overlap); ticks missed while the process was paused are logged. A
tick that finds Redis away (down, failing over) is tried again until
Redis answers or the next tick: a failover at the tick costs no run.

At start-up every scheduled job must be in the catalogue — a worker that
runs it must have announced it at least once ('scheduler jobs' lists
them) — or serve exits 1: start a worker that runs the job first. This
catches a misspelt job at once rather than at every tick. While the
catalogue is empty (a first deployment whose workers start beside the
scheduler) serve waits up to a minute for a worker to announce its jobs.
A job listed with no live worker only gets a warning: its runs wait for
a worker. Each --args must be JSON that fits the job's announced
arguments.

Example:
  scheduler serve --schedule 'orders-report=@every 10m' --args 'orders-report={"slow_ms": 0}'
  scheduler serve --schedule 'orders-report=0 6 * * 1-5' --schedule 'cleanup=@hourly'

Flags:
`

// catalogueWait is how long serve waits, at start-up, for a first worker
// to announce its jobs in an empty catalogue; it looks every
// catalogueRecheck. A catalogue with jobs in it is checked at once.
const (
	catalogueWait    = time.Minute
	catalogueRecheck = 500 * time.Millisecond
)

// schedule is one job's timetable.
type schedule struct {
	job  string
	spec string
	next func(time.Time) time.Time
	args json.RawMessage
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	url, err := redisFlag(fs)
	if err != nil {
		return err
	}
	var specs, jobArgs app.StringList
	fs.Var(&specs, "schedule", "JOB=SPEC: run JOB on SPEC (repeatable)")
	fs.Var(&jobArgs, "args", "JOB=JSON: the arguments of JOB's scheduled runs (repeatable)")
	newLogger := logFlags(fs)
	pos, err := parse(fs, serveUsage, args, stdout)
	if err != nil {
		return err
	}
	if err := want(pos, 0, 0, ""); err != nil {
		return err
	}
	log, err := newLogger(stderr)
	if err != nil {
		return err
	}
	scheds, err := parseSchedules(specs, jobArgs)
	if err != nil {
		return err
	}
	c, err := connect(ctx, *url, stderr)
	if err != nil {
		return err
	}
	defer c.close()
	catalogue, stopped, err := waitForCatalogue(ctx, c, log)
	if stopped {
		log.Info("scheduler: stopped")
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: %s", trim(err))
	}
	if err := checkSchedules(ctx, c, log, scheds, catalogue); err != nil {
		return err
	}
	log.Info("scheduler: serving", "schedules", []string(specs))
	runSchedules(ctx, c, log, scheds)
	log.Info("scheduler: stopped")
	return nil
}

// parseSchedules reads the --schedule and --args flags: a *app.UsageError
// names the fix of a bad one.
func parseSchedules(specs, jobArgs []string) ([]*schedule, error) {
	if len(specs) == 0 {
		return nil, app.Usagef("no --schedule: give at least one, e.g. --schedule 'orders-report=@every 10m'")
	}
	var scheds []*schedule
	for _, s := range specs {
		job, spec, ok := strings.Cut(s, "=")
		if !ok || job == "" {
			return nil, app.Usagef("--schedule %q: use JOB=SPEC, e.g. orders-report=@every 10m", s)
		}
		next, err := parseSpec(spec)
		if err != nil {
			return nil, app.Usagef("--schedule %q: %v", s, err)
		}
		scheds = append(scheds, &schedule{job: job, spec: spec, next: next})
	}
	argsOf := map[string]json.RawMessage{}
	for _, a := range jobArgs {
		job, js, ok := strings.Cut(a, "=")
		switch {
		case !ok:
			return nil, app.Usagef("--args %q: use JOB=JSON, e.g. --args 'orders-report={\"page_size\": 100}'", a)
		case !slices.ContainsFunc(scheds, func(s *schedule) bool { return s.job == job }):
			return nil, app.Usagef("--args %q: %s has no --schedule", a, job)
		case argsOf[job] != nil:
			return nil, app.Usagef("--args %q: %s has --args already: give each job one", a, job)
		}
		if err := app.JSONError(js); err != nil {
			return nil, app.Usagef("--args %q: %.100q is not JSON (%v): keys and strings take double quotes, and the whole takes single quotes for the shell, e.g. --args '%s={\"page_size\": 100}'", a, js, err, job)
		}
		argsOf[job] = json.RawMessage(js)
	}
	for _, s := range scheds {
		s.args = argsOf[s.job]
	}
	return scheds, nil
}

// waitForCatalogue returns the catalogue's jobs. While it is empty, it
// waits up to catalogueWait for a worker to announce its jobs: a first
// deployment starts its scheduler beside its workers (docker compose up).
// It reports stopped when ctx ends the wait.
func waitForCatalogue(ctx context.Context, c *conn, log *slog.Logger) (_ []mapreduce.JobInfo, stopped bool, _ error) {
	catalogue, err := c.mr.Jobs(ctx)
	if len(catalogue) > 0 || err != nil {
		return catalogue, false, err
	}
	log.Info("scheduler: no worker has announced a job yet: waiting for one", "up_to", catalogueWait)
	for deadline := time.Now().Add(catalogueWait); len(catalogue) == 0 && (err == nil || rediserr.Transient(err)) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return nil, true, nil
		case <-time.After(catalogueRecheck):
		}
		catalogue, err = c.mr.Jobs(ctx)
	}
	return catalogue, false, err
}

// checkSchedules checks each schedule's job against the catalogue: known,
// with JSON arguments that fit its announced schema, and, when a live
// worker runs it, its own Validate.
func checkSchedules(ctx context.Context, c *conn, log *slog.Logger, scheds []*schedule, catalogue []mapreduce.JobInfo) error {
	for _, s := range scheds {
		i := slices.IndexFunc(catalogue, func(j mapreduce.JobInfo) bool { return j.Name == s.job })
		if i < 0 {
			return fmt.Errorf("--schedule %s=%s: %s; then serve again (it checks its jobs at start-up)", s.job, s.spec, c.unknownJob(s.job, catalogue))
		}
		info := catalogue[i]
		if !info.JSON {
			return fmt.Errorf("--schedule %s=%s: the job's arguments are not JSON (its codec is its own), so the scheduler cannot start it: start it from Go with Job.Start", s.job, s.spec)
		}
		if err := checkArgs(info.ArgsSchema, s.args); err != nil {
			return app.Usagef("%s: %v", argsFlag(s), err)
		}
		if len(info.Workers) == 0 {
			log.Warn("scheduler: no live worker runs the job: its runs will wait until one starts, and its own Validate checks --args only then", "job", s.job)
		} else if err := c.mr.CheckJSON(ctx, s.job, s.args); err != nil {
			// A live worker ran the job's own Validate.
			return app.Usagef("%s: %s", argsFlag(s), trim(err))
		}
	}
	return nil
}

// runSchedules fires each schedule's ticks, and publishes them for the
// console, until ctx is done; then waits for the ticks under way.
func runSchedules(ctx context.Context, c *conn, log *slog.Logger, scheds []*schedule) {
	var firing sync.WaitGroup
	published := make(chan struct{})
	ticked := make(chan struct{}, 1) // a tick fired: publish the next ones now
	go func() { publish(ctx, c, log, scheds, ticked); close(published) }()
	for {
		// The earliest next tick of any schedule.
		now := time.Now()
		var due time.Time
		for _, s := range scheds {
			if t := s.next(now); due.IsZero() || t.Before(due) {
				due = t
			}
		}
		select {
		case <-ctx.Done():
			<-published
			firing.Wait()
			return
		case <-time.After(time.Until(due)):
		}
		for _, s := range scheds {
			if s.next(now).Equal(due) {
				// Each tick in its own goroutine: one that waits for Redis
				// must not hold up the other schedules' ticks.
				firing.Add(1)
				go func() { defer firing.Done(); fire(ctx, c.mr, log, s, due) }()
				select {
				case ticked <- struct{}{}:
				default:
				}
				// Woken late (a paused process): the ticks
				// in between are not run, but they are not silent either.
				if next := s.next(due); time.Now().After(next) {
					log.Warn("scheduler: ticks missed", "job", s.job, "after", due, "until", time.Now())
				}
			}
		}
	}
}

// publishEvery is how often serve republishes its schedules, for the web
// console's next ticks; they drop out three beats after serve stops.
const publishEvery = 5 * time.Second

// publish keeps the schedules, with their next ticks, in Redis until ctx
// is done, then withdraws them: every publishEvery, and at once when a
// tick fires (ticked), so that the console never shows a tick that has
// passed as the next. Failing to is logged, never fatal: the copy is only
// for display.
func publish(ctx context.Context, c *conn, log *slog.Logger, scheds []*schedule, ticked <-chan struct{}) {
	host, _ := os.Hostname()
	process := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	tick := time.NewTicker(publishEvery)
	defer tick.Stop()
	for {
		list := make([]schedules.Schedule, len(scheds))
		now := time.Now()
		for i, s := range scheds {
			list[i] = schedules.Schedule{Job: s.job, Spec: s.spec, Next: s.next(now)}
		}
		if err := schedules.Publish(ctx, c.rdb, app.Prefix, process, 3*publishEvery, list); err != nil && ctx.Err() == nil {
			log.Warn("scheduler: could not publish the schedules for the console", "error", err)
		}
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = schedules.Withdraw(wctx, c.rdb, app.Prefix, process)
			cancel()
			return
		case <-tick.C:
		case <-ticked:
		}
	}
}

// fire starts the run of one tick; another replica may have started it.
// While Redis cannot be reached it tries again, until the schedule's next
// tick: the run is named after its tick, so a second try cannot start a
// second run, and a Redis that fails over at 06:00 does not cost the day's
// run. So does a job missing from the catalogue, which serve checked at
// start-up: a Redis that came back empty has it again once a worker
// announces it.
func fire(ctx context.Context, mr *mapreduce.Client, log *slog.Logger, s *schedule, tick time.Time) {
	key := tick.UTC().Format("20060102T150405Z")
	until := s.next(tick)
	bo := backoff.Backoff{Min: fireRetryMin, Max: fireRetryMax}
	var id string
	var err error
	tries := 1
	for ; ; tries++ {
		id, err = mr.StartJSON(ctx, s.job, s.args, mapreduce.StartOptions{Key: key})
		wait := bo.Next()
		again := rediserr.Transient(err) || errors.Is(err, mapreduce.ErrUnknownJob)
		if !again || ctx.Err() != nil || time.Now().Add(wait).After(until) {
			if tries > 1 && err == nil {
				log.Info("scheduler: Redis answers again", "job", s.job, "tick", tick, "tries", tries)
			}
			break
		}
		if tries == 1 {
			log.Warn("scheduler: could not start the tick's run; retrying until Redis answers (and a worker has announced the job) or the next tick",
				"job", s.job, "tick", tick, "next_tick", until, "error", trim(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if ctx.Err() != nil {
			break
		}
	}
	switch {
	case err == nil:
		log.Info("scheduler: started a run", "run", id, "job", s.job, "tick", tick)
	case errors.Is(err, mapreduce.ErrRunExists) && tries > 1:
		log.Info("scheduler: the tick's run exists: an earlier try of this replica's, which Redis took as it went away, or another replica started it", "run", id, "job", s.job, "tick", tick)
	case errors.Is(err, mapreduce.ErrRunExists):
		log.Info("scheduler: the tick's run was started by another replica", "run", id, "job", s.job, "tick", tick)
	case errors.Is(err, mapreduce.ErrRunActive):
		log.Warn("scheduler: tick skipped: the job's previous run is still going", "job", s.job, "tick", tick, "error", trim(err))
	case errors.Is(err, mapreduce.ErrInvalidArgs):
		log.Error("scheduler: tick skipped: the job refused its arguments; fix --args and restart", "job", s.job, "tick", tick, "error", trim(err))
	case ctx.Err() != nil:
	default:
		hand := "scheduler run " + s.job + " --key " + key
		if s.args != nil {
			hand += " --args '" + string(s.args) + "'"
		}
		log.Error("scheduler: could not start the tick's run; to start it by hand: "+hand, "job", s.job, "tick", tick, "error", trim(err))
	}
}

// fireRetryMin and fireRetryMax pace fire's tries while Redis is away.
const (
	fireRetryMin = 250 * time.Millisecond
	fireRetryMax = 5 * time.Second
)

// parseSpec returns the function giving a spec's next tick after a time.
func parseSpec(spec string) (func(time.Time) time.Time, error) {
	if d, ok := strings.CutPrefix(spec, "@every "); ok {
		every, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil || every < time.Second {
			return nil, fmt.Errorf("@every %q: use a duration of at least 1s, e.g. @every 10m", d)
		}
		// Multiples of the duration since the Unix epoch, so that every
		// replica computes the same ticks.
		return func(t time.Time) time.Time {
			n := t.UnixNano() / int64(every)
			return time.Unix(0, (n+1)*int64(every))
		}, nil
	}
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fmt.Errorf("not a cron spec (%v): use 5 fields, a descriptor like @hourly, or @every DURATION", err)
	}
	return func(t time.Time) time.Time { return sched.Next(t.UTC()) }, nil
}

// argsFlag names a schedule's arguments in a message: its --args, or, when
// none was given, the zero value its runs would get.
func argsFlag(s *schedule) string {
	if s.args == nil {
		return fmt.Sprintf("--schedule %s=%s without --args (its runs get the job's zero arguments; give them with --args %s=JSON)", s.job, s.spec, s.job)
	}
	return fmt.Sprintf("--args %s=%s", s.job, s.args)
}
