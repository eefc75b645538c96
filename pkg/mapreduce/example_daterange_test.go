package mapreduce_test

import (
	"context"
	"fmt"
	"iter"
	"os"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// A job over a date range whose Map needs the run's arguments: Map sees
// only its page, so the page carries what Map needs of them — here the
// kind of event to count, beside the day. The page travels in its map
// task: Map reads nothing more. Keep what it carries small: every task
// holds a copy.
func Example_dateRange() {
	opt, err := redis.ParseURL(os.Getenv("BATCHMR_TEST_REDIS_URL"))
	if err != nil {
		panic("examples need BATCHMR_TEST_REDIS_URL (make test sets it): " + err.Error())
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	prefix := "bmrexample:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer exampleCleanup(rdb, prefix, prefix+":daily-kind")

	// events stands for a table: the events of each day, by kind.
	events := map[string]map[string]int{
		"2026-11-01": {"click": 3, "view": 5},
		"2026-11-02": {"click": 4},
		"2026-11-03": {"click": 1, "view": 2},
	}
	type args struct {
		From, To string // days, inclusive: "2026-11-01"
		Kind     string
	}
	// day is a page: one day, and the arguments Map needs.
	type day struct {
		Date string
		Kind string
	}
	job := mapreduce.Job[args, day, int, int]{
		Name: "daily-kind",
		Validate: func(a args) error {
			from, err1 := time.Parse(time.DateOnly, a.From)
			to, err2 := time.Parse(time.DateOnly, a.To)
			if err1 != nil || err2 != nil || to.Before(from) {
				return fmt.Errorf("from %q to %q: give two days, YYYY-MM-DD, the first not after the second", a.From, a.To)
			}
			return nil
		},
		Split: func(ctx context.Context, a args, emit func(day) error) error {
			from, _ := time.Parse(time.DateOnly, a.From)
			to, _ := time.Parse(time.DateOnly, a.To)
			for d := from; !d.After(to); d = d.AddDate(0, 0, 1) {
				if err := emit(day{Date: d.Format(time.DateOnly), Kind: a.Kind}); err != nil {
					return err
				}
			}
			return nil
		},
		Map: func(ctx context.Context, p day) (int, error) {
			return events[p.Date][p.Kind], nil // SELECT count(*) … WHERE day = $1 AND kind = $2
		},
		Reduce: func(ctx context.Context, a args, pages iter.Seq2[mapreduce.PageResult[day, int], error]) (int, error) {
			total := 0
			for pr, err := range pages {
				if err != nil {
					return 0, err
				}
				fmt.Printf("day %d: %d\n", pr.Index+1, pr.Result)
				total += pr.Result
			}
			return total, nil
		},
	}
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, job); err != nil {
		panic(err)
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix})
	if err != nil {
		panic(err)
	}
	cfg, err := mr.ServerConfig(asynq.Config{TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	if err != nil {
		panic(err)
	}
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mr.Register(mux)
	if err := srv.Start(mux); err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	id, err := job.Start(ctx, mr, args{From: "2026-11-01", To: "2026-11-03", Kind: "click"}, mapreduce.StartOptions{})
	if err != nil {
		panic(err)
	}
	st, err := mr.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	total, err := job.Result(st)
	if err != nil {
		panic(err)
	}
	fmt.Println(st.State, total, "clicks")
	// Output:
	// day 1: 3
	// day 2: 4
	// day 3: 1
	// succeeded 8 clicks
}
