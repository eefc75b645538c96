package console

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

type jobRow struct {
	mapreduce.JobInfo
	Runs            string // link to the job's runs
	Schedules       []schedules.Schedule
	WithoutDatabase []string // WithoutDatabase of the job
}

type jobsView struct {
	Jobs  []jobRow
	Now   time.Time
	Empty string // why there are no jobs, and what to check
}

func (c *Console) jobsData(ctx context.Context, _ *http.Request) (string, string, any, error) {
	catalogue, err := c.cfg.MapReduce.Jobs(ctx)
	if err != nil {
		return "Jobs", "/jobs/live", nil, err
	}
	scheds, err := schedules.List(ctx, c.cfg.Redis, c.cfg.Prefix)
	if err != nil {
		return "Jobs", "/jobs/live", nil, err
	}
	v := jobsView{Now: time.Now(), Empty: c.emptyCatalogue()}
	for _, j := range catalogue {
		jr := jobRow{JobInfo: j, Runs: "/runs?" + url.Values{"job": {j.Name}}.Encode(), WithoutDatabase: WithoutDatabase(j)}
		for _, s := range scheds {
			if s.Job == j.Name {
				jr.Schedules = append(jr.Schedules, s)
			}
		}
		v.Jobs = append(v.Jobs, jr)
	}
	return "Jobs", "/jobs/live", v, nil
}
