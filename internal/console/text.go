package console

import (
	"fmt"
	"strconv"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// PagesText is a run's Pages as people read it: the total, "~N" while the
// split runs and said to expect N pages, or "?" while neither is known.
func PagesText(st *mapreduce.Status) string {
	n, ok := st.Pages()
	switch {
	case !ok:
		return "?"
	case st.Total < 0:
		return "~" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}

// TasksText says, as people read it, how a run gives its pages to map
// tasks and what by: "64 pages a task from page 512 (Map takes under 1µs
// a page on average)", "a task a page (Map takes 3ms …)", or "" before
// any page is recorded.
func TasksText(st *mapreduce.Status) string {
	avg := st.MapAverage.String()
	if st.MapAverage < time.Microsecond {
		avg = "under 1µs"
	}
	switch {
	case st.PagesPerTask > 1:
		return fmt.Sprintf("%d pages a task from page %d (Map takes %s a page on average)", st.PagesPerTask, st.PackedFrom, avg)
	case st.MapAverage > 0:
		return fmt.Sprintf("a task a page (Map takes %s a page on average)", avg)
	}
	return ""
}

// WithoutDatabase returns the IDs of job j's live workers that say they
// have no database (WorkerInfo.Database) while others of its workers say
// they have one: if the job calls worker.Database, the pages those take
// are handed back to the queue, which slows its runs. Workers that say
// nothing are left out.
func WithoutDatabase(j mapreduce.JobInfo) []string {
	var with bool
	var without []string
	for _, w := range j.Workers {
		switch {
		case w.Database == nil: // says nothing
		case *w.Database:
			with = true
		default:
			without = append(without, w.ID)
		}
	}
	if !with {
		return nil
	}
	return without
}
