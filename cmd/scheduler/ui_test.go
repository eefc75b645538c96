package main_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/internal/testenv"
)

// 'scheduler ui' serves the console of the deployment it points at, on the
// address it prints, until SIGINT.
func TestUIServesTheConsoleOfItsDeploymentUntilInterrupted(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host([]string{"db"}, sumJob("sum", nil))
	s := newScheduler(t, f)
	p := s.start("ui", "--listen", "127.0.0.1:0", "--read-only")
	addr := regexp.MustCompile(`console on (http://127\.0\.0\.1:\d+/)`)
	var url string
	testenv.WaitFor(t, 10*time.Second, "the console's address", func() bool {
		m := addr.FindStringSubmatch(p.stderr.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	resp, err := http.Get(url + "jobs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `data-job="sum"`) || !strings.Contains(string(body), "read-only") {
		t.Errorf("GET /jobs: %d, want the read-only jobs page listing sum:\n%s", resp.StatusCode, body)
	}
	p.interrupt(10 * time.Second)
	out, errs, code := s.run("ui", "--help")
	if help := out + errs; code != 0 || !strings.Contains(help, "loopback") || !strings.Contains(help, "BATCHMR_UI_TOKEN") || !strings.Contains(help, "--read-only") {
		t.Errorf("ui --help: exit %d, want the loopback, token and read-only notes:\n%s", code, help)
	}
	out, _, _ = s.run("--help")
	if !strings.Contains(out, "scheduler ui") {
		t.Errorf("the usage does not list ui:\n%s", out)
	}
}

// 'scheduler serve' publishes its schedules with their next ticks while it
// runs, for the console, and withdraws them when it stops.
func TestServePublishesItsSchedulesWhileItRuns(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.host(nil, sumJob("sum", nil))
	s := newScheduler(t, f)
	p := s.start("serve", "--schedule", "sum=@every 1h", "--args", `sum={"n": 1, "page_size": 1}`)
	var list []schedules.Schedule
	testenv.WaitFor(t, 10*time.Second, "the published schedule", func() bool {
		list, _ = schedules.List(context.Background(), f.rdb, f.prefix)
		return len(list) == 1
	})
	if got := list[0]; got.Job != "sum" || got.Spec != "@every 1h" || !got.Next.After(time.Now()) || got.Next.After(time.Now().Add(time.Hour)) {
		t.Errorf("published %+v, want sum's @every 1h with its next tick within the hour", got)
	}
	if !p.interrupt(10 * time.Second) {
		t.FailNow()
	}
	if list, _ := schedules.List(context.Background(), f.rdb, f.prefix); len(list) != 0 {
		t.Errorf("after serve stopped its schedules are still published: %+v", list)
	}
}
