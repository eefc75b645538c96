package metrics_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// A page handed back by a stopping worker is not a failed attempt: its
// series says handed_back, and failed stays at zero.
func TestAHandedBackPageIsNotCountedAsFailed(t *testing.T) {
	o := metrics.NewObserver()
	reg := prometheus.NewRegistry()
	reg.MustRegister(o)
	_, done := o.Step(context.Background(), mapreduce.Step{Kind: mapreduce.StepMap, Job: "j", Run: "j:1", Page: 3, Attempt: 1})
	done(fmt.Errorf("mapreduce: page 3 of j:1: this worker is stopping: %w", mapreduce.ErrHandedBack))
	_, done = o.Step(context.Background(), mapreduce.Step{Kind: mapreduce.StepMap, Job: "j", Run: "j:1", Page: 4, Attempt: 1})
	done(fmt.Errorf("boom"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "batchmr_page_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					counts[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if counts[metrics.OutcomeHandedBack] != 1 || counts[metrics.OutcomeFailed] != 1 {
		t.Errorf("page attempts by outcome: %v; want one handed_back and one failed", counts)
	}
}
