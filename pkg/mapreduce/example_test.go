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

// A complete job: count the words of some documents, a page per document.
// The worker and the starter are one process here; in production they are
// many (see cmd/worker and cmd/scheduler).
func Example() {
	opt, err := redis.ParseURL(os.Getenv("BATCHMR_TEST_REDIS_URL"))
	if err != nil {
		panic("examples need BATCHMR_TEST_REDIS_URL (make test sets it): " + err.Error())
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	// Unique names, so that the example runs beside other users of the
	// server; a real program keeps the defaults.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "bmrexample:" + run
	defer exampleCleanup(rdb, prefix, prefix+":wordcount")

	type page struct{ Doc, Text string }
	wordcount := mapreduce.Job[[]string, page, int, int]{
		Name: "wordcount",
		// Split streams one page per document.
		Split: func(ctx context.Context, docs []string, emit func(page) error) error {
			for i, text := range docs {
				if err := emit(page{Doc: fmt.Sprint("doc", i), Text: text}); err != nil {
					return err
				}
			}
			return nil
		},
		// Map counts one page's words; it may run more than once per page.
		Map: func(ctx context.Context, p page) (int, error) {
			n, inWord := 0, false
			for _, r := range p.Text {
				if r == ' ' {
					inWord = false
				} else if !inWord {
					inWord, n = true, n+1
				}
			}
			return n, nil
		},
		// Reduce sees every page's result, in split order, exactly once.
		Reduce: func(ctx context.Context, docs []string, pages iter.Seq2[mapreduce.PageResult[page, int], error]) (int, error) {
			total := 0
			for pr, err := range pages {
				if err != nil {
					return 0, err
				}
				total += pr.Result
			}
			return total, nil
		},
	}
	jobs := mapreduce.NewJobs()
	if err := mapreduce.AddJob(jobs, wordcount); err != nil {
		panic(err)
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Jobs: jobs, Prefix: prefix})
	if err != nil {
		panic(err)
	}

	// The worker: an ordinary asynq server serving the job's own queue.
	// (The worker package does all of this, and more, in one call.)
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

	// Any process can start a run: typed arguments, no dependencies.
	id, err := wordcount.Start(ctx, mr, []string{"the quick brown fox", "jumps over", "the lazy dog"}, mapreduce.StartOptions{})
	if err != nil {
		panic(err)
	}
	st, err := mr.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	words, err := wordcount.Result(st)
	if err != nil {
		panic(err)
	}
	fmt.Println(st.State, st.Done, "pages,", words, "words")
	// Output: succeeded 3 pages, 9 words
}

func exampleCleanup(rdb *redis.Client, prefix, queue string) {
	ctx := context.Background()
	for _, pattern := range []string{prefix + "*", "asynq:{" + queue + "}:*"} {
		for _, k := range rdb.Keys(ctx, pattern).Val() {
			rdb.Del(ctx, k)
		}
	}
	rdb.SRem(ctx, "asynq:queues", queue)
}

// A Split that goes on from a cursor: it marks each page with the last
// name it holds, and when the split starts again part-way (a long run's
// split hands on every half SplitTimeout; a crashed one is retried) it
// lists only the names after the last page fed, so that a listing that
// changed meanwhile is neither read twice nor skipped at the join.
func ExampleResumeSplit() {
	type page struct{ Names []string }
	list := func(after string, limit int) []string { // a source listed in order, as an object store is
		return nil
	}
	job := mapreduce.Job[string, page, int, int]{
		Name: "files",
		Split: func(ctx context.Context, _ string, emit func(page) error) error {
			after, _ := mapreduce.ResumeSplit(ctx) // "" unless an earlier attempt fed pages
			for {
				names := list(after, 100)
				if len(names) == 0 {
					return nil
				}
				after = names[len(names)-1]
				mapreduce.SetSplitCursor(ctx, after) // where to go on after this page
				if err := emit(page{Names: names}); err != nil {
					return err
				}
			}
		},
		Map: func(ctx context.Context, p page) (int, error) { return len(p.Names), nil },
	}
	_ = job
}
