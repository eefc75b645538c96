package main_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batchmr/batchmr/examples/pagination/ordersreport"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
)

// secretMark starts every password this test gives the commands: no byte
// they print may contain it.
const secretMark = "Sekret"

// A deployment whose REDIS_URL and DATABASE_URL hold passwords: nothing
// the worker, the scheduler's commands or the console print shows them.
// Help, logs at debug level, every command's output and errors,
// /metrics, /readyz and every console page are scanned.
func TestNoCommandPrintsAPasswordOfItsURLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pw := secretMark + randomHex(t) // letters and digits: the same in a URL
	rdb, prefix := testenv.Redis(t)
	// An ACL user of the test's own, as docs/operations.md's Security
	// section recommends: the deployment's keys and asynq's, no
	// @dangerous command (KEYS, CONFIG, FLUSHALL, MONITOR, ...).
	user := "batchmr-" + randomHex(t)
	if err := rdb.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pw, "~"+prefix+":*", "~asynq:*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { rdb.Do(context.Background(), "ACL", "DELUSER", user) })
	redisURL, err := url.Parse(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	redisURL.User = url.UserPassword(user, pw)
	pool, schema := testenv.Postgres(t)
	if err := ordersreport.Seed(ctx, pool, 2000); err != nil {
		t.Fatal(err)
	}
	dbURL, err := url.Parse(testenv.DatabaseURLIn(t, schema))
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts every local connection, so the password
	// travels in the URL without being asked for: what matters is where
	// it is printed.
	dbURL.User = url.UserPassword(dbURL.User.Username(), pw)
	testenv.JobQueue(t, rdb, prefix, ordersreport.Name)

	env := append(os.Environ(), "REDIS_URL="+redisURL.String(), "DATABASE_URL="+dbURL.String(),
		"BATCHMR_PREFIX="+prefix, "LOG_LEVEL=debug", "LOG_FORMAT=text")
	sched := &scheduler{t: t, bin: schedulerBinary(t), env: env}
	workerBin := binaries.Build(t, "../worker")
	var scanned []output
	check := func(what, text string) {
		t.Helper()
		scanned = append(scanned, output{what, text})
	}
	cmd := func(args ...string) (string, string, int) {
		t.Helper()
		out, errOut, code := sched.run(args...)
		check("scheduler "+strings.Join(args, " "), out+errOut)
		return out, errOut, code
	}

	// Help, of every command: the flags' defaults come from the
	// environment.
	for _, args := range [][]string{{"--help"}, {"jobs", "--help"}, {"run", "--help"}, {"serve", "--help"},
		{"status", "--help"}, {"runs", "--help"}, {"cancel", "--help"}, {"retry", "--help"},
		{"permits", "--help"}, {"permits", "get", "--help"}, {"permits", "set", "--help"}, {"ui", "--help"}} {
		cmd(args...)
	}
	help := exec.Command(workerBin, "--help")
	help.Env = env
	out, _ := help.CombinedOutput()
	check("worker --help", string(out))
	if !strings.Contains(string(out), user+":xxxxx@") {
		t.Errorf("worker --help: want REDIS_URL's default shown with its password masked (%s:xxxxx@...); got\n%s", user, out)
	}

	// The example's seed and check tool, a template users copy.
	pagination := binaries.Build(t, "../../examples/pagination")
	for _, args := range [][]string{{"seed", "--help"}, {"check", "x"}} {
		c := exec.Command(pagination, args...)
		c.Env = append(env, "REDIS_URL=redis://admin:"+pw+"@localhost:63x9/0")
		out, _ := c.CombinedOutput()
		check("pagination "+strings.Join(args, " "), string(out))
	}

	// A worker at debug level, serving /metrics, through a whole run.
	metricsAddr := freeAddr(t)
	w := exec.Command(workerBin, "--metrics-addr", metricsAddr, "--poll-interval", "20ms", "--concurrency", "4")
	w.Env = env
	wlog := &testenv.LogBuffer{}
	w.Stdout, w.Stderr = wlog, wlog
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Process.Kill(); _ = w.Wait() })
	waitForText(t, wlog, "worker: started")
	cmd("jobs")
	cmd("jobs", "--json")
	runOut, errOut, code := cmd("run", ordersreport.Name, "--args", `{"page_size": 500}`, "--wait")
	if code != 0 {
		t.Fatalf("run --wait: exit %d\n%s%s", code, runOut, errOut)
	}
	mr, err := mapreduce.New(rdb, mapreduce.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := mr.Runs(ctx, ordersreport.Name)
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs of %s: %v, %v; want the one run", ordersreport.Name, runs, err)
	}
	id := runs[0].ID
	cmd("status", id)
	cmd("status", id, "--json")
	cmd("runs")
	cmd("permits", "get")
	cmd("permits", "get", "db", "--verbose")
	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		check("worker "+path, get(t, "http://"+metricsAddr+path))
	}

	serve := sched.start("serve", "--schedule", ordersreport.Name+"=@every 1h")
	waitForText(t, serve.stderr, "scheduler: serving")
	serve.interrupt(10 * time.Second)
	check("scheduler serve", serve.stdout.String()+serve.stderr.String())

	// The console, every page of it.
	ui := sched.start("ui", "--listen", "127.0.0.1:0")
	base := consoleAt(t, ui, "http")
	q := url.QueryEscape(id)
	for _, path := range []string{"runs", "runs/live", "run?id=" + q, "run/live?id=" + q, "jobs", "jobs/live",
		"semaphores", "semaphores/live", "semaphore?name=db", "semaphore/live?name=db", "login"} {
		check("console /"+path, get(t, base+path))
	}
	ui.interrupt(10 * time.Second)
	check("scheduler ui", ui.stdout.String()+ui.stderr.String())

	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Errorf("worker after SIGTERM: %v", err)
	}
	check("worker's logs", wlog.String())
	if !strings.Contains(wlog.String(), "level=DEBUG") {
		t.Errorf("the worker logged nothing at debug level, so the scan missed that level:\n%s", wlog.Tail(20))
	}

	// Errors: malformed, unreachable and refused, each holding a password.
	bad := map[string]string{
		"a malformed Redis URL":    "redis://admin:" + pw + "@localhost:63x9/0",
		"an unreachable Redis":     "redis://admin:" + pw + "@127.0.0.1:1/0",
		"a refused password":       strings.Replace(redisURL.String(), pw, pw+"x", 1),
		"a malformed Cluster URL":  "redis://admin:" + pw + "@localhost:7000?addr=localhost",
		"an unreachable Cluster":   "redis://admin:" + pw + "@127.0.0.1:1?addr=127.0.0.1:2",
		"a malformed Sentinel URL": "redis://:" + pw + "@localhost:26379/0?master_name=main&password=" + pw + "&bogus=1",
	}
	for what, u := range bad {
		_, errOut, code := sched.with("REDIS_URL=" + u).run("jobs")
		check("scheduler jobs with "+what, errOut)
		if code == 0 || errOut == "" {
			t.Errorf("scheduler jobs with %s: exit %d, stderr %q; want an error", what, code, errOut)
		}
		wc := exec.Command(workerBin)
		wc.Env = append(env, "REDIS_URL="+u)
		out, _ := wc.CombinedOutput()
		check("worker with "+what, string(out))
	}
	for what, u := range map[string]string{
		"a malformed database URL":  "postgres://app:" + pw + "@localhost:54x2/shop",
		"an unreachable database":   "postgres://app:" + pw + "@127.0.0.1:1/shop?connect_timeout=2",
		"a database URL as options": "host=127.0.0.1 port=1 user=app password=" + pw + " connect_timeout=2",
	} {
		wc := exec.Command(workerBin)
		wc.Env = append(env, "DATABASE_URL="+u)
		out, err := wc.CombinedOutput()
		check("worker with "+what, string(out))
		if err == nil {
			t.Errorf("worker with %s: exit 0; want an error", what)
		}
	}
	for _, args := range [][]string{{"jobs", "--redis-url", "redis://admin:" + pw + "@localhost:63x9/0"}, {"jobs", "--no-such-flag=" + pw}} {
		cmd(args...)
	}

	for _, o := range scanned {
		if strings.TrimSpace(o.text) == "" {
			t.Errorf("%s printed nothing: the scan cannot have looked at it", o.what)
		}
		if i := strings.Index(o.text, "NOPERM"); i >= 0 {
			t.Errorf("%s was refused by the recommended ACL: …%s…", o.what, o.text[max(0, i-80):min(len(o.text), i+120)])
		}
		if i := strings.Index(o.text, secretMark); i >= 0 {
			t.Errorf("%s printed a password: …%s…", o.what, o.text[max(0, i-80):min(len(o.text), i+40)])
		}
	}
}

type output struct{ what, text string }

// waitForText waits until log holds text.
func waitForText(t *testing.T, log *testenv.LogBuffer, text string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%q in the output", text), func() bool {
		return strings.Contains(log.String(), text)
	})
}

func randomHex(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// freeAddr is a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get returns the status line and body of a GET of u.
func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	h, _ := json.Marshal(resp.Header)
	return resp.Status + "\n" + string(h) + "\n" + string(body)
}
