package outage_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/outage"
)

// clock is a clock the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// newLog returns a Log on a clock the test moves, and a function that
// returns (and forgets) the records it wrote, at debug and above.
func newLog(t *testing.T) (*outage.Log, *clock, func() []map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := &clock{t: time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)}
	records := func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			out = append(out, m)
		}
		buf.Reset()
		return out
	}
	return outage.NewWithClock(log, "test", c.now), c, records
}

func levels(recs []map[string]any) string {
	var l []string
	for _, r := range recs {
		l = append(l, r["level"].(string))
	}
	return strings.Join(l, " ")
}

var errDown = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")

func TestAnOutageLogsItsFirstFailureAtWarnTheRestAtDebugAndItsEndWithDurationAndCount(t *testing.T) {
	t.Parallel()
	o, c, records := newLog(t)
	for range 100 {
		o.Failed(nil, outage.Database, "sums", errDown)
		c.advance(100 * time.Millisecond)
	}
	recs := records()
	if recs[0]["level"] != "WARN" || recs[0]["error"] != errDown.Error() || recs[0]["cause"] != string(outage.Database) {
		t.Errorf("the first failure is a warning with its error and cause: %v", recs[0])
	}
	if got := levels(recs[1:]); strings.Contains(got, "WARN") || len(recs) != 100 {
		t.Errorf("the 99 failures after the first log at debug: %d records, levels %s", len(recs), got)
	}
	c.advance(2 * time.Second)
	o.Ended(outage.Database, "sums")
	recs = records()
	if len(recs) != 1 || recs[0]["level"] != "INFO" || recs[0]["failures"] != 100.0 || recs[0]["lasted"] != float64(12*time.Second) {
		t.Fatalf("its end is one info line with how long it lasted (12 s from the first failure) and the failures (100): %v", recs)
	}
	if o.Ongoing() {
		t.Error("the outage still lasts after its end")
	}
	o.Ended(outage.Database, "sums")
	if recs := records(); len(recs) != 0 {
		t.Errorf("ending an outage that is over logs nothing: %v", recs)
	}
}

func TestAnOutageThatLastsIsRemindedOfOnceAMinute(t *testing.T) {
	t.Parallel()
	o, c, records := newLog(t)
	for range 300 { // 5 minutes, a failure a second
		o.Failed(nil, outage.Redis, "asynq", errDown)
		c.advance(time.Second)
	}
	var warns []map[string]any
	for _, r := range records() {
		if r["level"] == "WARN" {
			warns = append(warns, r)
		}
	}
	if len(warns) != 5 {
		t.Fatalf("5 minutes of outage: its start and a reminder a minute, 5 warnings; got %d: %v", len(warns), warns)
	}
	if r := warns[4]; r["for"] != float64(4*time.Minute) || r["failures"] != 241.0 {
		t.Errorf("the last reminder says for how long (4m) and how many failures (241): %v", r)
	}
}

func TestEachCauseIsItsOwnOutage(t *testing.T) {
	t.Parallel()
	o, c, records := newLog(t)
	o.Failed(nil, outage.Database, "sums", errDown)
	o.Failed(nil, outage.Redis, "sums", errDown)
	o.Failed(nil, outage.Database, "sums", errDown)
	o.Failed(nil, outage.RedisFailover, "sums", errors.New("READONLY You can't write against a read only replica."))
	if got := levels(records()); got != "WARN WARN DEBUG WARN" {
		t.Errorf("a new cause gets its own first line: levels %s, want WARN WARN DEBUG WARN", got)
	}
	c.advance(time.Second)
	o.Ended(outage.Redis, "")
	recs := records()
	if len(recs) != 1 || recs[0]["cause"] != string(outage.Redis) {
		t.Fatalf("ending one cause ends it alone: %v", recs)
	}
	o.Failed(nil, outage.Database, "sums", errDown)
	if got := levels(records()); got != "DEBUG" {
		t.Errorf("the database outage went on: %s", got)
	}
	c.advance(outage.Settle)
	o.Failed(nil, outage.Redis, "sums", errDown)
	if got := levels(records()); got != "WARN" {
		t.Errorf("a cause that ended and comes back is a new outage: %s", got)
	}
}

// A success of something that did not fail for an outage says nothing of
// it: a job that does not use the database succeeds through its outage.
func TestAnOutageEndsOnlyWhenWhatFailedForItSucceeds(t *testing.T) {
	t.Parallel()
	o, _, records := newLog(t)
	o.Failed(nil, outage.Database, "sums", errDown)
	records()
	o.Ended(outage.Database, "counts")
	o.EndedAll("counts")
	if recs := records(); len(recs) != 0 || !o.Ongoing() {
		t.Fatalf("another job's success ended the outage: %v", recs)
	}
	o.EndedAll("sums")
	if recs := records(); len(recs) != 1 || recs[0]["level"] != "INFO" || o.Ongoing() {
		t.Errorf("the job's success ends it: %v", recs)
	}
}

func TestTheFirstFailureLogsThroughTheCallersLoggerWithItsAttributes(t *testing.T) {
	t.Parallel()
	o, _, records := newLog(t)
	var buf bytes.Buffer
	step := slog.New(slog.NewJSONHandler(&buf, nil)).With("run", "sums:1")
	o.Failed(step, outage.Database, "sums", errDown, slog.Int("page", 7))
	var r map[string]any
	if err := json.Unmarshal(buf.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r["run"] != "sums:1" || r["page"] != 7.0 || r["error"] != errDown.Error() {
		t.Errorf("the first failure's line carries the caller's attributes and its error: %v", r)
	}
	if recs := records(); len(recs) != 0 {
		t.Errorf("and goes nowhere else: %v", recs)
	}
}

func TestAMarkedErrorKeepsItsTextAndSaysItsCause(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("pgsource: fetching page: %w", outage.Mark(io.ErrUnexpectedEOF, outage.Database))
	if got := outage.CauseOf(err); got != outage.Database {
		t.Errorf("CauseOf a wrapped mark: %q, want %q", got, outage.Database)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || err.Error() != "pgsource: fetching page: unexpected EOF" {
		t.Errorf("the mark changed the error: %v", err)
	}
	if outage.CauseOf(io.ErrUnexpectedEOF) != "" || outage.Mark(nil, outage.Database) != nil {
		t.Error("an unmarked error has a cause, or a nil error was marked")
	}
}

// An attempt that began before an outage ended may fail after: such
// stragglers log at debug, and only failures that go on past Settle make
// a new outage.
func TestFailuresJustAfterAnOutageEndedAreStragglersNotANewOutage(t *testing.T) {
	t.Parallel()
	o, c, records := newLog(t)
	o.Failed(nil, outage.Redis, "asynq", errDown)
	c.advance(10 * time.Second)
	o.Ended(outage.Redis, "")
	records()
	c.advance(outage.Settle - time.Millisecond)
	o.Failed(nil, outage.Redis, "asynq", errDown)
	if got := levels(records()); got != "DEBUG" || o.Ongoing() {
		t.Errorf("a failure within Settle of the end: %s (ongoing %v), want DEBUG and no outage", got, o.Ongoing())
	}
	c.advance(time.Millisecond)
	o.Failed(nil, outage.Redis, "asynq", errDown)
	if got := levels(records()); got != "WARN" {
		t.Errorf("a failure at Settle after the end starts a new outage: %s", got)
	}
}

// An outage that nothing here saw end (what failed for it succeeded on
// other workers) is over once nothing failed for it for a minute: a
// failure after that logs its end, at its last failure, and starts a new
// outage, rather than remind of one that lasted for days.
func TestAnOutageWithNoFailureForAMinuteWasOverAndTheNextFailureStartsANewOne(t *testing.T) {
	t.Parallel()
	o, c, records := newLog(t)
	o.Failed(nil, outage.Database, "sums", errDown)
	c.advance(3 * time.Second)
	o.Failed(nil, outage.Database, "sums", errDown)
	records()
	c.advance(48 * time.Hour)
	o.Failed(nil, outage.Database, "sums", errDown)
	recs := records()
	if got := levels(recs); got != "INFO WARN" {
		t.Fatalf("levels %s, want INFO (the old outage over) WARN (a new one): %v", got, recs)
	}
	if recs[0]["lasted"] != float64(3*time.Second) || recs[0]["failures"] != 2.0 {
		t.Errorf("the old outage's end: %v; want lasted 3s (to its last failure), 2 failures", recs[0])
	}
	c.advance(time.Second)
	o.Ended(outage.Database, "sums")
	if recs := records(); len(recs) != 1 || recs[0]["failures"] != 1.0 || recs[0]["lasted"] != float64(time.Second) {
		t.Errorf("the new outage's end: %v; want 1 failure, lasted 1s", recs)
	}
}
