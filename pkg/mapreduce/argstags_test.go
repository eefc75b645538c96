package mapreduce_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// taggedArgs state their bounds in jsonschema tags, for the scheduler to
// check with no worker, and every start to check with one.
type taggedArgs struct {
	PageSize int    `json:"page_size" jsonschema:"required,minimum=1,maximum=100000"`
	Mode     string `json:"mode,omitempty" jsonschema:"enum=full,enum=delta"`
	Level    uint8  `json:"level"`
}

func taggedJob(name string) mapreduce.Job[taggedArgs, int, int, int] {
	return mapreduce.Job[taggedArgs, int, int, int]{
		Name:  name,
		Split: func(ctx context.Context, a taggedArgs, emit func(int) error) error { return emit(a.PageSize) },
		Map:   func(ctx context.Context, p int) (int, error) { return p, nil },
	}
}

// A job's argument type announces its Go ranges and its jsonschema tags'
// bounds, enums and required fields in its schema; a typed Start and a
// JSON start refuse arguments outside them, naming the field and the
// bound, and create nothing.
func TestArgumentTagsAreAnnouncedAndEveryStartChecksThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := taggedJob("tagged")
	e.addJob(mapreduce.AddJob(e.jobs, job))
	c := e.client()
	starter, err := mapreduce.New(e.rdb, mapreduce.Config{Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	announce(t, starter, c)

	info, err := starter.Job(ctx, "tagged")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(info.ArgsSchema, &schema); err != nil || len(schema.Required) != 1 || schema.Required[0] != "page_size" ||
		string(schema.Properties["page_size"]) != `{"maximum":100000,"minimum":1,"type":"integer"}` ||
		string(schema.Properties["mode"]) != `{"enum":["full","delta"],"type":"string"}` ||
		string(schema.Properties["level"]) != `{"maximum":255,"minimum":0,"type":"integer"}` {
		t.Errorf("announced schema %s (%v): want page_size required in [1, 100000], mode full or delta, level in [0, 255]", info.ArgsSchema, err)
	}

	if _, err := job.Start(ctx, c, taggedArgs{PageSize: 0}, mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrInvalidArgs) ||
		!strings.Contains(err.Error(), `field "page_size" is 0, under its minimum 1`) {
		t.Errorf("typed Start with PageSize 0: %v; want ErrInvalidArgs naming the field and its minimum", err)
	}
	if _, err := job.Start(ctx, c, taggedArgs{PageSize: 10, Mode: "half"}, mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrInvalidArgs) ||
		!strings.Contains(err.Error(), `field "mode" is a string ("half"), not one of "full", "delta"`) {
		t.Errorf("typed Start with Mode half: %v; want ErrInvalidArgs naming the field and its values", err)
	}
	for _, tc := range []struct{ args, want string }{
		{`{"mode": "full"}`, `field "page_size" is missing: it is required`},
		{`{"page_size": 100001}`, `field "page_size" is 100001, over its maximum 100000`},
		{`{"page_size": 5, "level": 300}`, `level`},
	} {
		for who, start := range map[string]*mapreduce.Client{"the worker itself": c, "a live worker, asked": starter} {
			if _, err := start.StartJSON(ctx, "tagged", json.RawMessage(tc.args), mapreduce.StartOptions{}); !errors.Is(err, mapreduce.ErrInvalidArgs) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("StartJSON(%s), checked by %s: %v; want ErrInvalidArgs saying %q", tc.args, who, err, tc.want)
			}
		}
	}
	if runs, err := starter.Runs(ctx, "tagged"); err != nil || len(runs) != 0 {
		t.Errorf("refused starts created %d runs (%v), want none", len(runs), err)
	}
	if _, err := job.Start(ctx, c, taggedArgs{PageSize: 10, Mode: "delta"}, mapreduce.StartOptions{}); err != nil {
		t.Errorf("typed Start within the bounds: %v, want a run", err)
	}
}

// A jsonschema tag the scheduler could not read is an error when the job
// is registered, naming the field and the fix, not a check that never
// happens.
func TestAMalformedArgumentTagIsRefusedWhenTheJobIsAdded(t *testing.T) {
	type badArgs struct {
		PageSize int `json:"page_size" jsonschema:"minimum=one"`
	}
	job := mapreduce.Job[badArgs, int, int, int]{
		Name:  "bad",
		Split: func(ctx context.Context, a badArgs, emit func(int) error) error { return nil },
		Map:   func(ctx context.Context, p int) (int, error) { return p, nil },
	}
	err := mapreduce.AddJob(mapreduce.NewJobs(), job)
	if err == nil || !strings.Contains(err.Error(), `field PageSize`) || !strings.Contains(err.Error(), "minimum=one: write a number, e.g. minimum=1") {
		t.Errorf("AddJob of a job whose argument tag says minimum=one: %v; want an error naming the field and the fix", err)
	}
}
