package console_test

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/schedules"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/internal/tests/testenv/testhost"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
)

// noRedirects is a client that shows redirects instead of following them.
var noRedirects = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// get fetches path and returns the status and body.
func (f *fleet) get(path string) (int, string) {
	f.t.Helper()
	resp, err := noRedirects.Get(f.srv.URL + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post submits form to path as the console's own page would (same
// Origin), with extra headers, and returns the response with its body read.
func (f *fleet) post(path string, form url.Values, header ...string) (*http.Response, string) {
	f.t.Helper()
	return f.request(http.MethodPost, path, "", form, append([]string{"Origin", f.srv.URL, "Sec-Fetch-Site", "same-origin"}, header...)...)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf returns the CSRF token a page's forms carry.
func (f *fleet) csrf(path string) string {
	f.t.Helper()
	_, body := f.get(path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		f.t.Fatalf("%s has no form with a CSRF token:\n%s", path, body)
	}
	return m[1]
}

func runPath(id string) string { return "/run?" + url.Values{"id": {id}}.Encode() }

// slowRun starts a run that stays active until cancelled: one page at a
// time, ten seconds each.
func slowRun(f *fleet) string {
	f.host(1, nil, workJob("slow", nil, nil))
	return f.start("slow", workArgs{N: 5, SleepMS: 10_000})
}

func TestUnknownRunsSemaphoresAndPagesAre404Pages(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	for _, path := range []string{runPath("nosuch:run"), runPath("not-a-run-id"), runPath(""),
		"/semaphore?name=nosuch", "/semaphore?name=", "/semaphore?name=%7Bx%7D", "/no/such/page"} {
		code, body := f.get(path)
		if code != http.StatusNotFound || !strings.Contains(body, "<html") {
			t.Errorf("GET %s: %d, want a 404 page; body:\n%s", path, code, body)
		}
	}
	if code, _ := f.get("/run/live?id=nosuch:run"); code != http.StatusNotFound {
		t.Errorf("the live fragment of an unknown run: %d, want 404", code)
	}
	csrf := f.csrf("/login")
	if resp, body := f.post("/run/cancel", url.Values{"csrf": {csrf}, "id": {"nosuch:run"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("cancelling an unknown run: %d, want 404; body:\n%s", resp.StatusCode, body)
	}
	if resp, body := f.post("/semaphore/limit", url.Values{"csrf": {csrf}, "name": {"nosuch"}, "limit": {"3"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("setting the limit of an unknown semaphore: %d, want 404; body:\n%s", resp.StatusCode, body)
	}
	if n, _ := f.rdb.Exists(context.Background(), f.prefix+":sem:{nosuch}:limit").Result(); n != 0 {
		t.Errorf("the unknown semaphore got a limit in Redis")
	}
}

func TestJobErrorsAndResultsFromRedisAreEscaped(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	const evil = `<script>alert("pwned")</script>`
	f.host(2, nil, workJob("evil", nil, func(i int) error {
		if i == 1 {
			return &pageError{evil}
		}
		return nil
	}))
	id := f.start("evil", workArgs{N: 3})
	if st, _ := f.mr.Wait(context.Background(), id); st == nil || st.State != mapreduce.StateFailed {
		t.Fatalf("the run should fail on its page 1: %+v", st)
	}
	for _, path := range []string{runPath(id), "/run/live?id=" + url.QueryEscape(id), "/runs"} {
		code, body := f.get(path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", path, code)
		}
		if strings.Contains(body, "<script>alert") {
			t.Errorf("GET %s renders the job's error unescaped:\n%s", path, body)
		}
		if path != "/runs" && !strings.Contains(body, `&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;`) {
			t.Errorf("GET %s does not show the page's error, escaped:\n%s", path, body)
		}
		if path != "/runs" && !strings.Contains(body, `<code id="args">{&#34;n&#34;:3`) {
			t.Errorf("GET %s does not show the run's arguments:\n%s", path, body)
		}
	}
}

type pageError struct{ msg string }

func (e *pageError) Error() string { return e.msg }

func TestMutationsFromAnotherSiteOrWithoutTheCSRFTokenAreRefused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	id := slowRun(f)
	csrf := f.csrf(runPath(id))
	for _, c := range []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no token", url.Values{"id": {id}}, nil},
		{"a wrong token", url.Values{"id": {id}, "csrf": {strings.Repeat("0", len(csrf))}}, nil},
		// A browser sends Sec-Fetch-Site, which decides; one too old to
		// has only Origin.
		{"another site's Origin and no Sec-Fetch-Site", url.Values{"id": {id}, "csrf": {csrf}}, []string{"Origin", "https://evil.example", "Sec-Fetch-Site", ""}},
		{"a cross-site fetch", url.Values{"id": {id}, "csrf": {csrf}}, []string{"Sec-Fetch-Site", "cross-site"}},
	} {
		resp, body := f.post("/run/cancel", c.form, c.header...)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "Refused") {
			t.Errorf("cancel with %s: %d, want 403 Refused; body:\n%s", c.name, resp.StatusCode, body)
		}
	}
	if st := f.status(id); st.State.Ended() {
		t.Fatalf("a refused cancel cancelled the run: %s", st.State)
	}
	if code, _ := f.get("/run/cancel?id=" + url.QueryEscape(id)); code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
		t.Errorf("GET of a mutation: %d, want 405 or 404", code)
	}
	resp, _ := f.post("/run/cancel", url.Values{"id": {id}, "csrf": {csrf}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("cancel from the console's own page: %d, want 303", resp.StatusCode)
	}
	if st := f.status(id); st.State != mapreduce.StateCancelled {
		t.Fatalf("after the cancel the run is %s", st.State)
	}
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/run?") {
		t.Errorf("the cancel redirects to %q, want the run's page", loc)
	}
}

// With a token, the login form sets a session cookie (not the token
// itself) that reads and changes things as the bearer token does.
func TestTheTokenLogsInWithACookieOrABearerHeader(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	f := newFleet(t, console.Config{Token: token})
	id := slowRun(f)
	if resp, _ := f.request(http.MethodGet, runPath(id), "", nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next="+url.QueryEscape(runPath(id)) {
		t.Errorf("the run's page without the token: %d to %q, want a redirect to the login page and back", resp.StatusCode, resp.Header.Get("Location"))
	}
	csrf := f.csrf("/login")
	form := url.Values{"id": {id}, "csrf": {csrf}}
	if resp, body := f.post("/run/cancel", form); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `name="token"`) {
		t.Errorf("cancel without the token: %d, want 401 and a login form; body:\n%s", resp.StatusCode, body)
	}
	if resp, _ := f.post("/run/cancel", form, "Authorization", "Bearer wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("cancel with a wrong bearer token: %d, want 401", resp.StatusCode)
	}
	if resp, body := f.request(http.MethodGet, runPath(id), "", nil, "Authorization", "Bearer wrong"); resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "slow") {
		t.Errorf("the run's page with a wrong bearer token: %d, want 401 (a script's answer, not a redirect) and nothing shown", resp.StatusCode)
	}
	if resp, _ := f.post("/login", url.Values{"csrf": {csrf}, "token": {"wrong"}}); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("login with a wrong token: %d, cookies %v; want 401 and none", resp.StatusCode, resp.Cookies())
	}
	if st := f.status(id); st.State.Ended() {
		t.Fatalf("a cancel without the token cancelled the run: %s", st.State)
	}
	resp, _ := f.post("/login", url.Values{"csrf": {csrf}, "token": {token}, "next": {runPath(id)}})
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("login with the token: %d, cookies %v; want 303 and a session cookie", resp.StatusCode, resp.Cookies())
	}
	ck := resp.Cookies()[0]
	if resp, page := f.request(http.MethodGet, runPath(id), "", nil, "Cookie", ck.Name+"="+ck.Value); resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="cancel"`) {
		t.Errorf("the run's page with the session cookie: %d, want 200 and a Cancel button:\n%s", resp.StatusCode, page)
	}
	if ck.Value == token || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Errorf("the session cookie %+v should be HttpOnly, SameSite=Strict, and not the token itself", ck)
	}
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/run?") {
		t.Errorf("login redirects to %q, want back to the run", loc)
	}
	if resp, _ := f.post("/run/cancel", form, "Cookie", ck.Name+"="+ck.Value); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("cancel with the session cookie: %d, want 303", resp.StatusCode)
	}
	if st := f.status(id); st.State != mapreduce.StateCancelled {
		t.Fatalf("after the cancel with the session cookie the run is %s", st.State)
	}
	if resp, _ := f.post("/run/retry", form, "Authorization", "Bearer "+token); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry with the bearer token: %d, want 303", resp.StatusCode)
	}
}

func TestReadOnlyServesNoMutations(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{ReadOnly: true})
	sem := f.semaphore("db", 2)
	f.host(1, []string{"db"}, workJob("slow", sem, nil))
	id := f.start("slow", workArgs{N: 5, SleepMS: 10_000})
	// The first permit writes the limit.
	testenv.WaitFor(t, 5*time.Second, "the worker to hold a permit", func() bool {
		st, _ := sem.Stats(context.Background())
		return st.Held == 1
	})
	for _, path := range []string{runPath(id), "/semaphore?name=db", "/runs", "/jobs"} {
		code, body := f.get(path)
		if code != http.StatusOK || strings.Contains(body, `method="post"`) || strings.Contains(body, `name="csrf"`) {
			t.Errorf("GET %s: %d; a read-only console should serve no form:\n%s", path, code, body)
		}
		if !strings.Contains(body, "read-only") {
			t.Errorf("GET %s does not say the console is read-only", path)
		}
	}
	// Well-formed POSTs, with the CSRF token and from the console's own
	// origin: only read-only refuses them.
	csrf := f.csrf("/login")
	for path, form := range map[string]url.Values{
		"/run/cancel":      {"csrf": {csrf}, "id": {id}},
		"/run/retry":       {"csrf": {csrf}, "id": {id}},
		"/semaphore/limit": {"csrf": {csrf}, "name": {"db"}, "limit": {"7"}},
	} {
		if resp, body := f.post(path, form); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "it changes nothing") {
			t.Errorf("POST %s: %d, want 403 read-only; body:\n%s", path, resp.StatusCode, body)
		}
	}
	if st := f.status(id); st.State.Ended() {
		t.Errorf("a read-only console cancelled the run: %s", st.State)
	}
	if st, _ := sem.Stats(context.Background()); st.Limit != 2 {
		t.Errorf("a read-only console changed the limit to %d", st.Limit)
	}
}

// A limit that is no whole number of at least 1 is refused, and one that
// raises the limit many times over is set only once confirmed: either way
// nothing changes until the limit asked for is one meant.
func TestBadLimitsAreRefusedWithAMessageAndChangeNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	sem := f.semaphore("db", 3)
	f.host(1, []string{"db"}, workJob("work", sem, nil))
	// The limit is written with the first permit.
	id := f.start("work", workArgs{N: 1})
	if _, err := f.mr.Wait(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	csrf := f.csrf("/semaphore?name=db")
	for _, bad := range []string{"0", "-1", "abc", "", "2.5", "9999999999999999999999", strconv.Itoa(semaphore.MaxLimit + 1)} {
		resp, body := f.post("/semaphore/limit", url.Values{"csrf": {csrf}, "name": {"db"}, "limit": {bad}})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "refused") || !strings.Contains(body, "Nothing changed") {
			t.Errorf("limit %q: %d, want 400 and a message; body:\n%s", bad, resp.StatusCode, body)
		}
		if st, _ := sem.Stats(context.Background()); st.Limit != 3 {
			t.Fatalf("limit %q changed the limit to %d", bad, st.Limit)
		}
	}
	resp, _ := f.post("/semaphore/limit", url.Values{"csrf": {csrf}, "name": {"db"}, "limit": {" 5 "}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("limit 5: %d, want 303", resp.StatusCode)
	}
	if st, _ := sem.Stats(context.Background()); st.Limit != 5 {
		t.Fatalf("after setting 5 the limit is %d", st.Limit)
	}
	_, body := f.get(resp.Header.Get("Location"))
	if !strings.Contains(body, "Limit changed") || !strings.Contains(body, `data-limit="5"`) {
		t.Errorf("the semaphore's page after the change:\n%s", body)
	}

	// A large raise (5 to 1000: a typo of 10?) waits for a confirmation.
	resp, body = f.post("/semaphore/limit", url.Values{"csrf": {csrf}, "name": {"db"}, "limit": {"1000"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Raise the limit of db from 5 to 1000, 200× what it is?") ||
		!strings.Contains(body, `id="confirm-limit"`) || !strings.Contains(body, `name="confirm" value="1000"`) {
		t.Errorf("limit 1000 from 5: %d, want the confirmation asked; body:\n%s", resp.StatusCode, body)
	}
	if st, _ := sem.Stats(context.Background()); st.Limit != 5 {
		t.Fatalf("an unconfirmed raise changed the limit to %d", st.Limit)
	}
	if resp, _ := f.post("/semaphore/limit", url.Values{"csrf": {csrf}, "name": {"db"}, "limit": {"1000"}, "confirm": {"1000"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("limit 1000 confirmed: %d, want 303", resp.StatusCode)
	}
	if st, _ := sem.Stats(context.Background()); st.Limit != 1000 {
		t.Fatalf("after the confirmed raise the limit is %d", st.Limit)
	}
}

func TestRunsPageFiltersByJobAndState(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	// Before any worker announced a job: the page says where it looked.
	if code, body := f.get("/runs"); code != http.StatusOK ||
		!strings.Contains(body, "no worker has announced a job under prefix &#34;"+f.prefix+"&#34; in Redis database ") ||
		!strings.Contains(body, "BATCHMR_PREFIX they use") {
		t.Errorf("GET /runs with an empty catalogue: %d, want 200 and where the console looked; body:\n%s", code, body)
	}
	f.host(2, nil, workJob("alpha", nil, nil), workJob("beta", nil, func(int) error { return &pageError{"no"} }))
	a := f.start("alpha", workArgs{N: 2})
	b := f.start("beta", workArgs{N: 2})
	for _, id := range []string{a, b} {
		if _, err := f.mr.Wait(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	for query, want := range map[string][]string{
		"":                        {a, b},
		"?job=alpha":              {a},
		"?state=failed":           {b},
		"?job=alpha&state=failed": nil,
		"?state=active":           nil,
		"?job=beta&state=failed":  {b},
		"?job=&state=succeeded":   {a},
	} {
		code, body := f.get("/runs" + query)
		if code != http.StatusOK {
			t.Fatalf("GET /runs%s: %d", query, code)
		}
		for _, id := range []string{a, b} {
			listed := strings.Contains(body, `data-run="`+id+`"`)
			if wanted := strings.Contains(strings.Join(want, " "), id); listed != wanted {
				t.Errorf("GET /runs%s lists %s: %v, want %v", query, id, listed, wanted)
			}
		}
	}
	if code, body := f.get("/runs?state=bogus"); code != http.StatusBadRequest || !strings.Contains(body, "No state") {
		t.Errorf("an unknown state: %d, want 400 and a message; body:\n%s", code, body)
	}
}

func TestJobsPageShowsEachJobsWorkersAndNextTick(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	f.host(1, nil, workJob("nightly", nil, nil), workJob("adhoc", nil, nil))
	next := time.Now().Add(42 * time.Minute)
	if err := schedules.Publish(context.Background(), f.rdb, f.prefix, "serve-1", time.Minute,
		[]schedules.Schedule{{Job: "nightly", Spec: "0 3 * * *", Next: next}}); err != nil {
		t.Fatal(err)
	}
	ws, _ := f.mr.Workers(context.Background())
	_, body := f.get("/jobs")
	for _, want := range []string{`data-job="nightly"`, `data-job="adhoc"`, ws[0].ID, "0 3 * * *", "in 4", next.UTC().Format("15:04:05Z"), "not scheduled"} {
		if !strings.Contains(body, want) {
			t.Errorf("the jobs page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "Two versions") {
		t.Errorf("the jobs page warns of two versions while one runs:\n%s", body)
	}

	// Another version of adhoc's code, with other arguments, joins.
	type otherArgs struct {
		Pages int `json:"pages"`
	}
	f.host(1, nil, mapreduce.Job[otherArgs, [2]int, int, int]{
		Name:  "adhoc",
		Split: func(context.Context, otherArgs, func([2]int) error) error { return nil },
		Map:   func(context.Context, [2]int) (int, error) { return 0, nil },
	})
	_, body = f.get("/jobs")
	if !strings.Contains(body, "Two versions of this job run") || strings.Count(body, "Two versions") != 1 {
		t.Errorf("the jobs page does not warn, once, of adhoc's two versions:\n%s", body)
	}
	if strings.Contains(body, "Without a database") {
		t.Errorf("the jobs page warns of a worker without a database while none says so:\n%s", body)
	}

	// Of two workers of nightly, one says it has a database, one not.
	with, without := true, false
	f.hostWith(testhost.Options{Concurrency: 1, Database: &with}, workJob("nightly", nil, nil))
	bare := f.hostWith(testhost.Options{Concurrency: 1, Database: &without}, workJob("nightly", nil, nil))
	_, body = f.get("/jobs")
	if !strings.Contains(body, "Without a database, where other workers of this job have one: "+bare.ID+".") || strings.Count(body, "Without a database") != 1 {
		t.Errorf("the jobs page does not name, once, nightly's worker %s without a database:\n%s", bare.ID, body)
	}
}

func TestSemaphorePageShowsHoldersWaitersAndAChart(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	sem := f.semaphore("db", 1)
	f.host(3, []string{"db"}, workJob("work", sem, nil))
	f.start("work", workArgs{N: 6, SleepMS: 10_000})
	testenv.WaitFor(t, 5*time.Second, "one holder and two waiters", func() bool {
		st, _ := sem.Stats(context.Background())
		return st.Held == 1 && len(st.Waiters) == 2
	})
	testenv.WaitFor(t, 5*time.Second, "the chart", func() bool {
		_, body := f.get("/semaphore/live?name=db")
		return strings.Contains(body, `<polyline class="held"`)
	})
	_, body := f.get("/semaphore?name=db")
	// The holder's process is this test's, where the worker runs.
	ws, _ := f.mr.Workers(context.Background())
	if len(ws) != 1 {
		t.Fatalf("%d live workers, want the one", len(ws))
	}
	for _, want := range []string{`data-held="1"`, `data-waiters="2"`, `class="holder"`, "Oldest wait", `id="set-limit"`, `<td class="worker">` + ws[0].ID + `</td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("the semaphore's page lacks %q:\n%s", want, body)
		}
	}
	_, list := f.get("/semaphores")
	if !strings.Contains(list, `data-semaphore="db"`) {
		t.Errorf("the semaphores page does not list db:\n%s", list)
	}
}

// control runs sem's controller, with a window of 100ms, over a load of
// short permits until the test ends or stop is called, and returns once
// the controller has reported a window and set (or, in shadow mode, would
// set) an N.
func control(t *testing.T, sem *semaphore.Semaphore) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	wg.Go(func() {
		_ = sem.RunController(ctx, semaphore.ControllerOptions{Window: 100 * time.Millisecond, Logger: quiet})
	})
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_ = sem.Do(ctx, func(context.Context) error { time.Sleep(5 * time.Millisecond); return nil })
			}
		})
	}
	testenv.WaitFor(t, 10*time.Second, "the controller's first window and N", func() bool {
		st, err := sem.Stats(context.Background())
		return err == nil && st.Auto.Signals.Epoch > 0 && st.Auto.Controller > 0
	})
	return stop
}

// In auto and shadow mode the semaphore's page shows the bounds, the fixed
// N, the controller's N with its reason and its last window, and says that
// the form's limit ends the mode; in shadow mode its chart draws the N the
// controller would set. In fixed mode there is none of it.
func TestSemaphorePageShowsTheAutoModeAndChartsTheShadowN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, console.Config{})
	sem := f.semaphore("db", 4)
	f.host(1, []string{"db"}, workJob("work", sem, nil))
	lacks := func(path string, not ...string) {
		t.Helper()
		_, body := f.get(path)
		for _, s := range not {
			if strings.Contains(body, s) {
				t.Errorf("in fixed mode %s shows %q:\n%s", path, s, body)
			}
		}
	}
	if err := sem.SetLimit(ctx, 4); err != nil {
		t.Fatal(err)
	}
	lacks("/semaphore?name=db", `id="auto"`, `id="ends-auto"`, `class="shadow"`, "mode:")
	lacks("/semaphores", `class="automode"`)

	if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: 2, Max: 9, Fixed: 4}); err != nil {
		t.Fatal(err)
	}
	stop := control(t, sem)
	_, body := f.get("/semaphore?name=db")
	for _, want := range []string{`data-mode="auto"`, `data-min="2"`, `data-max="9"`, `data-fixed="4"`,
		"auto mode: bounds 2..9, fixed N 4; the limit last moved ", "; the controller set ", `<small id="window">its last window (`,
		`<b id="ends-auto">Setting it ends auto mode.</b>`, `<span class="key limit">limit N</span>`, `<span class="key waiters">waiting (requests)</span>`} {
		if !strings.Contains(body, want) {
			t.Errorf("in auto mode the semaphore's page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `class="shadow"`) {
		t.Errorf("in auto mode the chart draws a shadow N:\n%s", body)
	}
	if _, list := f.get("/semaphores"); !strings.Contains(list, `<small class="automode">auto 2..9</small>`) {
		t.Errorf("in auto mode the semaphores page does not show it:\n%s", list)
	}

	stop()
	if err := sem.SetAuto(ctx, semaphore.AutoLimits{Min: 2, Max: 9, Fixed: 4, Shadow: true}); err != nil {
		t.Fatal(err)
	}
	control(t, sem)
	testenv.WaitFor(t, 5*time.Second, "the shadow N on the chart", func() bool {
		_, body = f.get("/semaphore/live?name=db")
		return strings.Contains(body, `<path class="shadow" d="M`)
	})
	st, err := sem.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`data-mode="shadow"`, "shadow mode: bounds 2..9, fixed N 4;", "; the controller would set ",
		`<span class="key shadow">the controller's N, not applied (shadow mode)</span>`} {
		if !strings.Contains(body, want) {
			t.Errorf("in shadow mode the semaphore's page lacks %q:\n%s", want, body)
		}
	}
	if st.Limit != 4 {
		t.Errorf("in shadow mode the limit is %d, want the fixed N 4", st.Limit)
	}

	if err := sem.SetLimit(ctx, 4); err != nil {
		t.Fatal(err)
	}
	lacks("/semaphore?name=db", `id="auto"`, `id="ends-auto"`, "mode:")
}

// request sends method to path addressed to host (the Host header; ""
// for the server's own address), with form (for a POST) and headers given
// as pairs, and returns the response with its body read.
func (f *fleet) request(method, path, host string, form url.Values, header ...string) (*http.Response, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Host = host
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A web page can make a browser reach the console through a name of the
// page's own that resolves to the console's address (DNS rebinding): its
// requests are then same-origin for the browser. The console answers
// only localhost, IP addresses and its public URL's host, so such a page
// can neither read the CSRF token nor cancel a run.
func TestRequestsAddressedToAnotherNameAreRefused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	id := slowRun(f)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(f.srv.URL, "http://"))
	evil := "evil.example:" + port
	for _, path := range []string{"/runs", runPath(id), "/login", "/semaphores"} {
		if resp, body := f.request(http.MethodGet, path, evil, nil); resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, `name="csrf"`) {
			t.Errorf("GET %s as %s: %d, want 421 and no form; body:\n%s", path, evil, resp.StatusCode, body)
		}
	}
	csrf := f.csrf("/login") // as if it had been read some other way
	resp, body := f.request(http.MethodPost, "/run/cancel", evil, url.Values{"csrf": {csrf}, "id": {id}},
		"Origin", "http://"+evil, "Sec-Fetch-Site", "same-origin")
	if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(body, "--public-url") {
		t.Errorf("POST /run/cancel as %s: %d, want 421 naming --public-url; body:\n%s", evil, resp.StatusCode, body)
	}
	if st := f.status(id); st.State.Ended() {
		t.Fatalf("a request addressed to %s cancelled the run: %s", evil, st.State)
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "LOCALHOST"} {
		if resp, _ := f.request(http.MethodGet, "/runs", host, nil); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /runs as %s: %d, want 200", host, resp.StatusCode)
		}
	}
}

// Behind a reverse proxy the browser's origin is the public URL's while
// the proxy may rewrite the Host header to the console's own address:
// forms from that origin are the console's, and its login cookie is
// Secure. Cross-site posts are still refused.
func TestBehindAProxyFormsFromThePublicURLAreAccepted(t *testing.T) {
	t.Parallel()
	const public = "https://batchmr.example.com"
	f := newFleet(t, console.Config{PublicURL: public, Token: "s3cret"})
	id := slowRun(f)
	direct := strings.TrimPrefix(f.srv.URL, "http://")
	if resp, _ := f.request(http.MethodGet, "/runs", "batchmr.example.com", nil, "Authorization", "Bearer s3cret"); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /runs as the public URL's host: %d, want 200", resp.StatusCode)
	}
	csrf := f.csrf("/login")
	resp, _ := f.request(http.MethodPost, "/login", direct, url.Values{"csrf": {csrf}, "token": {"s3cret"}, "next": {"/runs"}},
		"Origin", public)
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "batchmr_ui_session" {
			session = ck
		}
	}
	if resp.StatusCode != http.StatusSeeOther || session == nil || !session.Secure {
		t.Fatalf("login through the proxy: %d, cookie %+v; want 303 and a Secure session cookie", resp.StatusCode, session)
	}
	cancel := url.Values{"csrf": {csrf}, "id": {id}}
	if resp, body := f.request(http.MethodPost, "/run/cancel", direct, cancel, "Origin", "https://elsewhere.example", "Cookie", session.Name+"="+session.Value); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cancel from another origin: %d, want 403; body:\n%s", resp.StatusCode, body)
	}
	if st := f.status(id); st.State.Ended() {
		t.Fatalf("a cross-origin post cancelled the run: %s", st.State)
	}
	if resp, body := f.request(http.MethodPost, "/run/cancel", direct, cancel, "Origin", public, "Cookie", session.Name+"="+session.Value); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a cancel from the public URL through the proxy: %d, want 303; body:\n%s", resp.StatusCode, body)
	}
	if st := f.status(id); st.State != mapreduce.StateCancelled {
		t.Errorf("the run after a cancel through the proxy: %s, want cancelled", st.State)
	}
}

func TestABadPublicURLIsRefusedWithTheFix(t *testing.T) {
	for _, bad := range []string{"batchmr.example.com", "ftp://x", "https://", "https://x/console", "https://x?a=1"} {
		if err := console.CheckPublicURL(bad); err == nil || !strings.Contains(err.Error(), "https://console.example.com") {
			t.Errorf("CheckPublicURL(%q) = %v, want an error with an example", bad, err)
		}
	}
	if err := console.CheckPublicURL("https://batchmr.example.com:8443"); err != nil {
		t.Errorf("a good public URL refused: %v", err)
	}
}

// A large run's split lasts most of the run (its window holds it back), so
// its total is unknown until the end: the pages its Split said to expect
// give the run's progress and ETA meanwhile, marked "~".
func TestARunsProgressShowsThePagesItsSplitExpectsBeforeItsTotal(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	job := workJob("expecting", nil, nil)
	split := job.Split
	job.Split = func(ctx context.Context, a workArgs, emit func([2]int) error) error {
		if err := mapreduce.ExpectPages(ctx, a.N); err != nil {
			return err
		}
		return split(ctx, a, emit)
	}
	job.Options.Window = 2
	f.host(2, nil, job)
	id := f.start("expecting", workArgs{N: 400, SleepMS: 20})
	testenv.WaitFor(t, 10*time.Second, "a page done while the split runs", func() bool {
		st := f.status(id)
		return st.State == mapreduce.StateSplitting && st.Done > 0
	})
	for _, path := range []string{"/runs", runPath(id)} {
		if code, body := f.get(path); code != http.StatusOK || !strings.Contains(body, "/~400</span>") {
			t.Errorf("GET %s: %d, without the expected total \"/~400\" while splitting:\n%s", path, code, body)
		}
	}
}

// A run whose split fails and retries shows the failure on its page while
// it goes on: nothing else would say why it does not progress.
func TestARunsPageShowsItsStepsLastFailureWhileItRetries(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	job := workJob("stuck", nil, nil)
	job.Split = func(context.Context, workArgs, func([2]int) error) error {
		return errors.New(`relation "events" does not exist`)
	}
	job.Options = mapreduce.JobOptions{StepRetries: 5, Backoff: func(int, error) time.Duration { return time.Minute }}
	f.host(1, nil, job)
	id := f.start("stuck", workArgs{N: 3})
	testenv.WaitFor(t, 10*time.Second, "the split's failure on the run's page", func() bool {
		_, body := f.get(runPath(id))
		return strings.Contains(body, `id="last-error"`)
	})
	_, body := f.get(runPath(id))
	if !strings.Contains(body, "Last failure") || !strings.Contains(body, "split at ") || !strings.Contains(body, "relation &#34;events&#34; does not exist") ||
		!strings.Contains(body, `state-splitting`) {
		t.Errorf("the run's page: want it splitting, with its split's last failure:\n%s", body)
	}
}

// A run that stopped moving says so, instead of an ETA at its average
// rate: a database that hangs leaves no error to show, only the time since
// the run last changed.
func TestARunThatStoppedMovingShowsStalledInsteadOfAnETA(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	f.host(2, nil, workJob("stalling", nil, nil))
	id := f.start("stalling", workArgs{N: 2, SleepMS: 120_000})
	testenv.WaitFor(t, 10*time.Second, "the run to map", func() bool { return f.status(id).State == mapreduce.StateMapping })
	if _, body := f.get(runPath(id)); strings.Contains(body, `id="stalled"`) {
		t.Fatalf("a run that changed just now shown stalled:\n%s", body)
	}
	// As if its pages' queries had hung for two minutes.
	ms := strconv.FormatInt(time.Now().Add(-2*time.Minute).UnixMilli(), 10)
	if err := f.rdb.HSet(context.Background(), f.prefix+":{stalling}:run:"+id, "updated", ms).Err(); err != nil {
		t.Fatal(err)
	}
	// 2m0s, or a second or two more on a loaded machine.
	if _, body := f.get(runPath(id)); !strings.Contains(body, `id="stalled"`) || !regexp.MustCompile(`nothing recorded for 2m[0-5]s`).MatchString(body) ||
		strings.Contains(body, "ETA") {
		t.Errorf("the run's page: want it stalled for 2m0s, without an ETA:\n%s", body)
	}
	if _, body := f.get("/runs"); !regexp.MustCompile(`title="nothing recorded for 2m[0-5]s">stalled</span>`).MatchString(body) {
		t.Errorf("the runs page: want the run marked stalled:\n%s", body)
	}
}

// A run's page says how its pages went to tasks: cheap pages are packed
// several to a task once the run has measured them.
func TestARunsPageSaysHowItsPagesGoToTasks(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	job := workJob("cheap", nil, nil)
	job.Options.Window = 256 // the split waits for room, by when it has measured pages
	f.host(2, nil, job)
	id := f.start("cheap", workArgs{N: 2000})
	testenv.WaitFor(t, 30*time.Second, "the run to succeed", func() bool { return f.status(id).State == mapreduce.StateSucceeded })
	st := f.status(id)
	if st.PagesPerTask < 2 {
		t.Fatalf("a run of 2000 no-op pages gave each page a task (%+v): this test needs a packed run", st)
	}
	want := fmt.Sprintf(`<dd id="tasks">%d pages a task from page %d (Map takes`, st.PagesPerTask, st.PackedFrom)
	if _, body := f.get(runPath(id)); !strings.Contains(body, want) {
		t.Errorf("the run's page: want %q:\n%s", want, body)
	}
}

// With a token set, every route the console serves answers a request
// without it with a redirect to the login page (pages) or 401 (fragments
// and mutations), and never with a byte of what it shows; only the
// static assets and the login form are open. With the token, each serves
// what it shows.
func TestWithATokenEveryRouteServesNothingWithoutIt(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	f := newFleet(t, console.Config{Token: token})
	sem := f.semaphore("hushsem", 2)
	f.host(1, []string{"hushsem"}, workJob("hushjob", sem, nil))
	id := f.start("hushjob", workArgs{N: 5, SleepMS: 10_000})
	testenv.WaitFor(t, 5*time.Second, "the worker to hold a permit", func() bool {
		st, _ := sem.Stats(context.Background())
		return st.Held == 1
	})
	secrets := []string{id, "hushjob", "hushsem", `&#34;sleep_ms&#34;`}
	csrf := f.csrf("/login")
	// What each route is asked, and what its answer with the token holds.
	asks := map[string]struct {
		path  string
		form  url.Values
		authd url.Values // the form with the token, when another
		code  int
		shows string
	}{
		"GET /static/":          {"/static/console.css", nil, nil, http.StatusOK, "--accent"},
		"GET /login":            {"/login", nil, nil, http.StatusOK, `name="token"`},
		"POST /login":           {"/login", url.Values{"csrf": {csrf}, "next": {"/jobs"}}, url.Values{"csrf": {csrf}, "next": {"/jobs"}, "token": {token}}, http.StatusSeeOther, ""},
		"GET /{$}":              {"/", nil, nil, http.StatusSeeOther, ""},
		"GET /runs":             {"/runs", nil, nil, http.StatusOK, `data-run="` + id + `"`},
		"GET /runs/live":        {"/runs/live", nil, nil, http.StatusOK, `data-run="` + id + `"`},
		"GET /run":              {runPath(id), nil, nil, http.StatusOK, `<code id="args">{&#34;n&#34;:5`},
		"GET /run/live":         {"/run/live?id=" + url.QueryEscape(id), nil, nil, http.StatusOK, `<code id="args">{&#34;n&#34;:5`},
		"GET /jobs":             {"/jobs", nil, nil, http.StatusOK, `data-job="hushjob"`},
		"GET /jobs/live":        {"/jobs/live", nil, nil, http.StatusOK, `data-job="hushjob"`},
		"GET /semaphores":       {"/semaphores", nil, nil, http.StatusOK, `data-semaphore="hushsem"`},
		"GET /semaphores/live":  {"/semaphores/live", nil, nil, http.StatusOK, `data-semaphore="hushsem"`},
		"GET /semaphore":        {"/semaphore?name=hushsem", nil, nil, http.StatusOK, `data-limit="2"`},
		"GET /semaphore/live":   {"/semaphore/live?name=hushsem", nil, nil, http.StatusOK, `data-limit="2"`},
		"POST /run/cancel":      {"/run/cancel", url.Values{"csrf": {csrf}, "id": {id}}, nil, http.StatusSeeOther, ""},
		"POST /run/retry":       {"/run/retry", url.Values{"csrf": {csrf}, "id": {id}}, nil, http.StatusSeeOther, ""},
		"POST /semaphore/limit": {"/semaphore/limit", url.Values{"csrf": {csrf}, "name": {"hushsem"}, "limit": {"3"}}, nil, http.StatusSeeOther, ""},
		"/":                     {"/no/such/page", nil, nil, http.StatusNotFound, "No page at /no/such/page"},
	}
	open := map[string]bool{"GET /static/": true, "GET /login": true, "POST /login": true}
	routes := f.con.Routes()
	if len(routes) < len(asks) {
		t.Errorf("the console serves %d routes, this test asks %d: %v", len(routes), len(asks), routes)
	}
	ask := func(pattern string, header ...string) (*http.Response, string) {
		t.Helper()
		a, ok := asks[pattern]
		if !ok {
			t.Fatalf("the console serves %q, which this test does not ask: add what it is asked and shows", pattern)
		}
		method := http.MethodGet
		if strings.HasPrefix(pattern, "POST ") {
			method = http.MethodPost
		}
		form := a.form
		if a.authd != nil && len(header) > 0 {
			form = a.authd
		}
		return f.request(method, a.path, "", form, append([]string{"Origin", f.srv.URL, "Sec-Fetch-Site", "same-origin"}, header...)...)
	}
	for _, pattern := range routes {
		resp, body := ask(pattern)
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("%s without the token shows %q:\n%s", pattern, s, body)
			}
		}
		loc := resp.Header.Get("Location")
		switch {
		case open[pattern]:
		case resp.StatusCode == http.StatusUnauthorized:
		case resp.StatusCode == http.StatusSeeOther && loc == "/login?"+url.Values{"next": {asks[pattern].path}}.Encode():
			if body != "" {
				t.Errorf("%s without the token redirects with a body:\n%s", pattern, body)
			}
		default:
			t.Errorf("%s without the token: %d (Location %q), want 401 or a redirect to the login page", pattern, resp.StatusCode, loc)
		}
	}
	if st := f.status(id); st.State.Ended() {
		t.Fatalf("a request without the token ended the run: %s", st.State)
	}
	if st, _ := sem.Stats(context.Background()); st.Limit != 2 {
		t.Fatalf("a request without the token changed the limit to %d", st.Limit)
	}
	for _, pattern := range routes {
		resp, body := ask(pattern, "Authorization", "Bearer "+token) // and, to log in, the token in the form
		if a := asks[pattern]; resp.StatusCode != a.code || !strings.Contains(body, a.shows) {
			t.Errorf("%s with the token: %d, want %d and %q; body:\n%s", pattern, resp.StatusCode, a.code, a.shows, body)
		}
	}
	if st, _ := sem.Stats(context.Background()); st.Limit != 3 {
		t.Errorf("the limit set with the token is %d, want 3", st.Limit)
	}
}

// clock is a settable clock for the console's wrong-token limit.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// Guessing the token costs a minute per few guesses: after 5 wrong tokens
// from one address, in the login form or a bearer header, that address is
// refused with 429 and Retry-After, even with the right token, until the
// minute is over.
func TestWrongTokensFromOneAddressAreRefusedForAMinute(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := newFleet(t, console.Config{Token: token, Now: clk.Now})
	csrf := f.csrf("/login")
	login := func(tok string) *http.Response {
		resp, _ := f.post("/login", url.Values{"csrf": {csrf}, "token": {tok}, "next": {"/jobs"}})
		return resp
	}
	for i := range console.LoginFailures - 1 {
		if resp := login(fmt.Sprintf("guess-%d", i)); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	if resp, _ := f.request(http.MethodGet, "/jobs/live", "", nil, "Authorization", "Bearer guess"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the last wrong token allowed, as a bearer: %d, want 401", resp.StatusCode)
	}
	clk.add(30 * time.Second)
	resp, body := f.post("/login", url.Values{"csrf": {csrf}, "token": {token}, "next": {"/jobs"}})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "30" || len(resp.Cookies()) != 0 || !strings.Contains(body, "try again in 30s") {
		t.Errorf("the right token 30s after %d wrong ones: %d, Retry-After %q, cookies %v; want 429, 30 and none; body:\n%s",
			console.LoginFailures, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Cookies(), body)
	}
	if resp, body := f.request(http.MethodGet, "/jobs/live", "", nil, "Authorization", "Bearer "+token); resp.StatusCode != http.StatusTooManyRequests || strings.Contains(body, "data-job") {
		t.Errorf("the right bearer token while refused: %d, want 429 and nothing shown", resp.StatusCode)
	}
	clk.add(console.LoginWindow - 30*time.Second)
	if resp := login(token); resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("the right token once the minute is over: %d, cookies %v; want 303 and the session cookie", resp.StatusCode, resp.Cookies())
	}
	// A right token clears the count: a user who mistyped a few times is
	// not refused after mistyping a few times more.
	for round := range 2 {
		for range console.LoginFailures - 1 {
			login("guess")
		}
		if resp := login(token); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("round %d: the right token after %d wrong ones: %d, want 303", round+1, console.LoginFailures-1, resp.StatusCode)
		}
	}
}

// wordyRun runs a job of two pages, whose page 1 fails with pageErr,
// with the arguments args ({"note": "..."}), and returns the failed run's ID.
func wordyRun(f *fleet, args, pageErr string) string {
	f.t.Helper()
	type noteArgs struct {
		Note string `json:"note"`
	}
	f.host(2, nil, mapreduce.Job[noteArgs, [2]int, int, int]{
		Name: "wordy",
		Split: func(_ context.Context, _ noteArgs, emit func([2]int) error) error {
			if err := emit([2]int{0, 0}); err != nil {
				return err
			}
			return emit([2]int{1, 0})
		},
		Map: func(_ context.Context, p [2]int) (int, error) {
			if p[0] == 1 {
				return 0, &pageError{pageErr}
			}
			return 1, nil
		},
		Options: mapreduce.JobOptions{MapRetries: -1},
	})
	id, err := f.mr.StartJSON(context.Background(), "wordy", []byte(args), mapreduce.StartOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	if st, _ := f.mr.Wait(context.Background(), id); st == nil || st.State != mapreduce.StateFailed {
		f.t.Fatalf("the run should fail on its page 1: %+v", st)
	}
	return id
}

// A long argument, error or result is cut at 200 characters, whole inside
// a <details> a click away; short ones are shown whole.
func TestLongValuesAreCutAt200CharactersWithTheWholeValueOneClickAway(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	long := strings.Repeat("é<b>", 100) // 400 characters
	args := `{"note":"` + strings.Repeat("x", 300) + `"}`
	id := wordyRun(f, args, long)
	esc := func(s string) string { return template.HTMLEscapeString(s) }
	failures, _, err := f.mr.Failures(context.Background(), id, 1)
	if err != nil || len(failures) != 1 || !strings.HasSuffix(failures[0].Error, long) {
		t.Fatalf("the run's failures: %+v, %v; want page 1's, ending with its error", failures, err)
	}
	perr := failures[0].Error
	for _, path := range []string{runPath(id), "/run/live?id=" + url.QueryEscape(id)} {
		_, body := f.get(path)
		for _, want := range []string{
			`<details class="clip" id="args-all"><summary><code class="short">` + esc(args[:200]) + `…</code> <small class="more">` + strconv.Itoa(len(args)) + ` characters: show all</small></summary><code id="args">` + esc(args) + `</code></details>`,
			`<details class="clip" id="page-error-1-all"><summary><pre class="short">` + esc(string([]rune(perr)[:200])) + `…</pre> <small class="more">` + strconv.Itoa(len([]rune(perr))) + ` characters: show all</small></summary><pre id="page-error-1">` + esc(perr) + `</pre></details>`,
			`<code id="page-1">[1,0]</code>`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("GET %s lacks\n%s\nbody:\n%s", path, want, body)
			}
		}
	}
}

// A run whose job refused its arguments (started while no worker could
// check them) offers no retry, which would fail the same way, and says
// to start a new run with other arguments.
func TestARunFailedByItsArgumentsOffersANewRunNotARetry(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	job := workJob("picky", nil, nil)
	job.Validate = func(a workArgs) error {
		if a.N < 1 {
			return fmt.Errorf("n %d: use at least 1", a.N)
		}
		return nil
	}
	_, stop := testhost.Host(t, f.rdb, testhost.Options{Prefix: f.prefix, Logger: quiet}, job)
	stop() // the job is announced, but no worker is live to check arguments
	id := f.start("picky", workArgs{N: -1})
	f.host(1, nil, job)
	if st, err := f.mr.Wait(context.Background(), id); err != nil || !st.ArgsRefused() {
		t.Fatalf("the run: %+v, %v; want failed by its arguments", st, err)
	}
	code, body := f.get("/run?id=" + url.QueryEscape(id))
	if code != http.StatusOK || !strings.Contains(body, `id="args-refused"`) || !strings.Contains(body, "scheduler run picky --args") || strings.Contains(body, `id="retry"`) {
		t.Errorf("the run's page: %d; want the new-run hint and no Retry button:\n%s", code, body)
	}
}
