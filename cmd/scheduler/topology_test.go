//go:build unix

package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/worker"
	"github.com/redis/go-redis/v9"
)

// Every command and the console reach Redis through a Cluster URL, a
// cluster node's plain URL and a Sentinel URL as through one server, as
// the ACL user that docs/operations.md recommends: a worker on the same
// URL runs what 'run --wait' starts, status, runs and jobs show the run
// and the job, permits set and get change and read the worker's
// semaphore, and the console lists the job.
func TestTheCommandsAndTheConsoleWorkOverAClusterAndASentinelURL(t *testing.T) {
	t.Parallel()
	cluster := testenv.PrivateRedisCluster(t, nil)
	node := strings.TrimPrefix(cluster.URL, "redis://")
	sentinels := testenv.PrivateSentinels(t, testenv.SentinelOptions{Password: "data-pw", SentinelPassword: "sentinel-pw"})
	bin := schedulerBinary(t)
	for i, tc := range []struct {
		name string
		url  func(user, pw string) string
		data *redis.Client // a plain client of the server that holds the data
	}{
		{"Cluster URL", func(user, pw string) string { return "redis://" + user + ":" + pw + "@" + node + "?addr=" + node }, cluster.Client},
		{"a cluster node's plain URL", func(user, pw string) string { return "redis://" + user + ":" + pw + "@" + node + "/0" }, cluster.Client},
		{"Sentinel URL", func(user, pw string) string {
			return strings.Replace(sentinels.URL, "password=data-pw", "password="+pw+"&username="+user, 1)
		}, sentinels.Primary.Client},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := testenv.Prefix(t)
			user, pw := fmt.Sprintf("batchmr-%d", i), randomHex(t)
			if err := tc.data.Do(context.Background(), "ACL", "SETUSER", user, "on", ">"+pw, "~"+prefix+":*", "~asynq:*", "&*", "+@all", "-@dangerous").Err(); err != nil {
				t.Fatalf("ACL SETUSER: %v", err)
			}
			url := tc.url(user, pw)
			wctx, stop := context.WithCancel(context.Background())
			stopped := make(chan error, 1)
			go func() {
				stopped <- worker.Run(wctx, worker.Config{RedisURL: url, Prefix: prefix, Permits: map[string]int{"db": 2},
					PollInterval: 10 * time.Millisecond, Logger: quiet}, sumJob("sum", nil))
			}()
			defer func() {
				stop()
				if err := <-stopped; err != nil {
					t.Errorf("the worker: %v", err)
				}
			}()
			mr, err := mapreduce.New(tc.data, mapreduce.Config{Prefix: prefix, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "the worker to announce sum", func() bool {
				ws, _ := mr.Workers(context.Background())
				return slices.ContainsFunc(ws, func(w mapreduce.WorkerInfo) bool { return slices.Contains(w.Jobs, "sum") })
			})
			s := &scheduler{t: t, bin: bin, env: append(os.Environ(), "REDIS_URL="+url, "BATCHMR_PREFIX="+prefix)}

			out, errs, code := s.run("run", "sum", "--args", `{"n": 100, "page_size": 10}`, "--wait")
			if got := lines(out); code != 0 || len(got) != 2 || got[1] != "5050" {
				t.Fatalf("run --wait: exit %d, stdout %q, stderr %q; want the run ID then 5050", code, out, errs)
			}
			id := lines(out)[0]
			if out, errs, code := s.run("status", id); code != 0 || !strings.Contains(out, "succeeded") {
				t.Errorf("status: exit %d, stdout %q, stderr %q; want the run succeeded", code, out, errs)
			}
			if out, errs, code := s.run("runs"); code != 0 || !strings.Contains(out, id) {
				t.Errorf("runs: exit %d, stdout %q, stderr %q; want the run listed", code, out, errs)
			}
			if out, errs, code := s.run("jobs"); code != 0 || !strings.Contains(out, "sum") {
				t.Errorf("jobs: exit %d, stdout %q, stderr %q; want sum listed", code, out, errs)
			}
			if out, errs, code := s.run("permits", "set", "db", "3"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 3") {
				t.Errorf("permits set db 3: exit %d, stdout %q, stderr %q", code, out, errs)
			}
			if out, errs, code := s.run("permits", "get", "db"); code != 0 || !strings.HasPrefix(out, "semaphore db: limit 3, held 0, 0 waiting") {
				t.Errorf("permits get db: exit %d, stdout %q, stderr %q; want the limit set", code, out, errs)
			}
			p := s.start("ui", "--listen", "127.0.0.1:0", "--read-only")
			resp, err := http.Get(consoleAt(t, p, "http") + "jobs")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `data-job="sum"`) {
				t.Errorf("the console: GET /jobs: %d, want the jobs page listing sum:\n%s", resp.StatusCode, body)
			}
			p.interrupt(10 * time.Second)
			if denied, err := tc.data.Do(context.Background(), "ACL", "LOG").Result(); err != nil || strings.Contains(fmt.Sprint(denied), user) {
				t.Errorf("ACL LOG: %v, %v; want no denial of %s", denied, err, user)
			}
		})
	}
}

// A Redis Cluster has only database 0: a command given a Cluster URL, or
// a cluster node's plain URL, that asks for another stops at once with
// one line that says so and names the fix.
func TestACommandRefusesADatabaseOtherThanZeroOfACluster(t *testing.T) {
	t.Parallel()
	cluster := testenv.PrivateRedisCluster(t, nil)
	node := strings.TrimPrefix(cluster.URL, "redis://")
	s := &scheduler{t: t, bin: schedulerBinary(t), env: os.Environ()}
	for _, tc := range []struct{ url, want string }{
		{"redis://" + node + "/3?addr=" + node, "a Redis Cluster has only database 0, and this Cluster URL asks for database 3"},
		{cluster.URL + "/3", "the Redis server at " + node + " runs Redis Cluster, which has only database 0: drop /3 from --redis-url"},
	} {
		_, errs, code := s.with("REDIS_URL=" + tc.url).run("jobs")
		if code == 0 || !oneLine(errs) || !strings.Contains(errs, tc.want) {
			t.Errorf("jobs with REDIS_URL=%s: exit %d, stderr %q; want one line with %q", tc.url, code, errs, tc.want)
		}
	}
}
