package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/console"
	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/chromedp/chromedp"
)

// The browser tests drive the Chromium that BATCHMR_TEST_CHROMIUM names
// (make test installs Debian's and sets it): one headless browser per test
// binary, one tab per test.
var browser struct {
	once   sync.Once
	ctx    context.Context // the browser's: tabs derive from it
	cancel func()
	dir    string
	err    error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if browser.cancel != nil {
		browser.cancel()
	}
	if browser.dir != "" {
		_ = os.RemoveAll(browser.dir)
	}
	os.Exit(code)
}

func startBrowser(path string) {
	browser.dir, browser.err = os.MkdirTemp("", "batchmr-chromium-")
	if browser.err != nil {
		return
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(browser.dir),
		chromedp.WindowSize(1280, 860),
	)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	browser.ctx = ctx
	browser.cancel = func() { cancelCtx(); cancelAlloc() }
	// No timeout here: the first call's context is the browser's lifetime.
	if err := chromedp.Do(ctx); err != nil {
		browser.err = fmt.Errorf("starting %s: %w", path, err)
	}
}

// tab opens a browser tab for the test, closed when it ends; it skips the
// test when BATCHMR_TEST_CHROMIUM is unset, and fails it when the browser
// it names does not work.
func tab(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	path := os.Getenv("BATCHMR_TEST_CHROMIUM")
	if path == "" {
		t.Skip("browser test skipped: BATCHMR_TEST_CHROMIUM is unset; set it to a Chromium binary (make test installs Debian's chromium and sets it)")
	}
	browser.once.Do(func() { startBrowser(path) })
	if browser.err != nil {
		t.Fatalf("BATCHMR_TEST_CHROMIUM=%s does not work: %v", path, browser.err)
	}
	ctx, cancel := chromedp.NewContext(browser.ctx)
	t.Cleanup(cancel)
	ctx, cancelT := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancelT)
	return ctx
}

func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs one action that reads something from the page.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// intAttr reads an integer attribute of the first element sel matches.
func intAttr(t *testing.T, ctx context.Context, sel, attr string) int {
	t.Helper()
	v := value(t, ctx, "reading "+attr+" of "+sel, chromedp.AttributeValue(chromedp.CSS(sel), attr))
	n, err := strconv.Atoi(v.Value)
	if !v.Exists || err != nil {
		t.Fatalf("%s has no integer %s: %q", sel, attr, v.Value)
	}
	return n
}

func TestBrowserRunsPageShowsALiveRunAdvance(t *testing.T) {
	t.Parallel()
	ctx := tab(t, 15*time.Second)
	f := newFleet(t, console.Config{})
	f.host(2, nil, workJob("live", nil, nil))
	// Long enough (30 s) to be still going on a loaded machine whenever
	// the page is read; cancelled at the end. No state filter, so that
	// the row stays however the run goes.
	id := f.start("live", workArgs{N: 600, SleepMS: 100})
	t.Cleanup(func() { _ = f.mr.Cancel(context.Background(), id) })
	row := `tr[data-run="` + id + `"]`
	run(t, ctx, "loading the runs page", chromedp.Navigate(f.srv.URL+"/runs"), chromedp.WaitVisible(chromedp.CSS(row)))
	first := intAttr(t, ctx, row, "data-pages")
	// The page is never reloaded: what changes is the live fragment.
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`(function () { var r = document.querySelector(%q); return !!r && +r.dataset.pages > %d; })()`, row, first),
		chromedp.WithPollingTimeout(5*time.Second))); err != nil {
		t.Fatalf("the runs page still shows %d pages after 5s (%v); Redis says %d", first, err, f.status(id).Done)
	}
	progress := value(t, ctx, "reading the progress bar", chromedp.AttributeValue(chromedp.CSS(row+" progress"), "value")).Value
	if p, err := strconv.ParseFloat(progress, 64); err != nil || p <= 0 || p > 100 {
		t.Errorf("the progress bar's value is %q, want a percentage above 0", progress)
	}
}

func TestBrowserCancelsARunByClicking(t *testing.T) {
	t.Parallel()
	ctx := tab(t, 15*time.Second)
	f := newFleet(t, console.Config{})
	id := slowRun(f)
	run(t, ctx, "cancelling from the run's page",
		chromedp.Navigate(f.srv.URL+runPath(id)),
		chromedp.Click(chromedp.CSS("#cancel")),
		chromedp.WaitVisible(chromedp.CSS("#notice")))
	state := value(t, ctx, "reading the run's state", chromedp.Text(chromedp.CSS("#state")))
	if state != string(mapreduce.StateCancelled) {
		t.Errorf("after the click the page shows the run %q", state)
	}
	if st := f.status(id); st.State != mapreduce.StateCancelled {
		t.Errorf("after the click Redis has the run %s", st.State)
	}
}

func TestBrowserChangesALimitThroughTheFormAndTheWorkersObeyIt(t *testing.T) {
	t.Parallel()
	ctx := tab(t, 20*time.Second)
	f := newFleet(t, console.Config{})
	sem := f.semaphore("db", 4)
	f.host(4, []string{"db"}, workJob("busy", sem, nil))
	id := f.start("busy", workArgs{N: 400, SleepMS: 80})
	stats := func() (int, int) {
		st, err := sem.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return st.Limit, st.Held
	}
	testenv.WaitFor(t, 5*time.Second, "the workers to hold 4 permits", func() bool { _, held := stats(); return held == 4 })
	run(t, ctx, "setting the limit to 2 with the form",
		chromedp.Navigate(f.srv.URL+"/semaphore?name=db"),
		chromedp.SetValue(chromedp.CSS("#limit"), "2"),
		chromedp.Click(chromedp.CSS("#set-limit")),
		chromedp.WaitVisible(chromedp.CSS("#notice")))
	if n := intAttr(t, ctx, "#summary", "data-limit"); n != 2 {
		t.Errorf("after the change the page shows limit %d", n)
	}
	if limit, _ := stats(); limit != 2 {
		t.Fatalf("after the change Redis has limit %d", limit)
	}
	// Holders granted before the change finish their page; after that,
	// nobody is granted beyond the new limit.
	testenv.WaitFor(t, 5*time.Second, "the permits held to fit the new limit", func() bool { _, held := stats(); return held <= 2 })
	// Watched while the workers do 15 more pages.
	sawTwo := false
	from := f.status(id).Done
	if !testenv.Eventually(10*time.Second, func() bool {
		_, held := stats()
		if held > 2 {
			t.Fatalf("the workers hold %d permits under a limit of 2", held)
		}
		sawTwo = sawTwo || held == 2
		return sawTwo && f.status(id).Done >= from+15
	}) {
		t.Errorf("in 10s under the new limit, the workers did %d pages and used both its permits: %v; are they still working?", f.status(id).Done-from, sawTwo)
	}
}

// In shadow mode the chart draws, through live updates, the controller's
// N as a line of its own, in a colour of its own, with its key in the
// legend.
func TestBrowserChartsTheControllersShadowNAsALineOfItsOwn(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	sem := f.semaphore("db", 4)
	f.host(1, []string{"db"}, workJob("work", sem, nil))
	if err := sem.SetAuto(context.Background(), semaphore.AutoLimits{Min: 2, Max: 9, Fixed: 4, Shadow: true}); err != nil {
		t.Fatal(err)
	}
	control(t, sem)
	ctx := tab(t, 20*time.Second)
	run(t, ctx, "opening the semaphore's page", chromedp.Navigate(f.srv.URL+"/semaphore?name=db"))
	// Drawn by a live update: the line has length once two samples are in.
	value(t, ctx, "waiting for the shadow N's line", chromedp.Poll[bool](
		`(function () { var p = document.querySelector("#chart path.shadow"); return !!p && p instanceof SVGPathElement && p.getTotalLength() > 0; })()`))
	got := value(t, ctx, "reading the lines' colours", chromedp.Evaluate[[]string](`(function () {
		function stroke(sel) { return getComputedStyle(document.querySelector(sel)).stroke; }
		return [stroke("#chart path.shadow"), stroke("#chart .limit"), stroke("#chart .held"), stroke("#chart .waiters"),
			getComputedStyle(document.querySelector("#legend .key.shadow"), "::before").backgroundImage];
	})()`))
	if len(got) != 5 || got[0] == "none" || got[0] == "" || got[0] == got[1] || got[0] == got[2] || got[0] == got[3] || !strings.Contains(got[4], got[0]) {
		t.Errorf("strokes of the shadow N, limit, held and waiting, then the shadow key's: %q; want the shadow N's a colour of its own, and its key in it", got)
	}
}

// A long value opened with "show all" stays open while the live part of
// the page is replaced every second.
func TestBrowserKeepsALongValueOpenAcrossLiveUpdates(t *testing.T) {
	t.Parallel()
	f := newFleet(t, console.Config{})
	id := wordyRun(f, `{"note":"short"}`, strings.Repeat("a long error ", 40))
	ctx := tab(t, 20*time.Second) // for the browser's steps alone
	// In script, not by node: the live part replaces these nodes every
	// second, and chromedp's waits on a replaced node stall for seconds.
	run(t, ctx, "opening the run's page", chromedp.Navigate(f.srv.URL+runPath(id)))
	value(t, ctx, "waiting for the page's error, cut", chromedp.Poll[bool](
		`(function () { var d = document.getElementById("page-error-1-all"); return !!d && !d.open; })()`))
	if !value(t, ctx, "opening the whole value", chromedp.Evaluate[bool](
		`document.querySelector("#page-error-1-all summary").click(); document.getElementById("page-error-1-all").open`)) {
		t.Fatal("a click on the cut value's summary did not open it")
	}
	// Marked, so that its replacement shows.
	value(t, ctx, "marking the live part", chromedp.Evaluate[bool](`document.querySelector("#live dl").dataset.old = "1"; true`))
	value(t, ctx, "waiting for a live update", chromedp.Poll[bool](`document.querySelector("#live dl[data-old]") === null`))
	if open := value(t, ctx, "reading the details", chromedp.Evaluate[bool](`document.getElementById("page-error-1-all").open`)); !open {
		t.Errorf("a live update closed the long value opened")
	}
}

// With a token, a page asked for without it leads to the login form, and
// the token given there leads back to that page, with its buttons.
func TestBrowserLogsInAndLandsOnThePageAskedFor(t *testing.T) {
	t.Parallel()
	ctx := tab(t, 20*time.Second)
	const token = "s3cret-token"
	f := newFleet(t, console.Config{Token: token})
	id := slowRun(f)
	run(t, ctx, "logging in from the run's page",
		chromedp.Navigate(f.srv.URL+runPath(id)),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#cancel")))
	if state := value(t, ctx, "reading the run's state", chromedp.Text(chromedp.CSS("#state"))); state == "" {
		t.Errorf("after the login the run's page shows no state")
	}
}

// TestBrowserScreenshot writes screenshots of the runs and semaphore pages
// during runs into the directory BATCHMR_CONSOLE_SCREENSHOTS names (for
// docs/console.png); without it, it is skipped.
func TestBrowserScreenshot(t *testing.T) {
	dir := os.Getenv("BATCHMR_CONSOLE_SCREENSHOTS")
	if dir == "" {
		t.Skip("set BATCHMR_CONSOLE_SCREENSHOTS to a directory to take the console's screenshots")
	}
	ctx := tab(t, 60*time.Second)
	f := newFleet(t, console.Config{SampleEvery: 250 * time.Millisecond, History: 80})
	sem := f.semaphore("db", 6)
	f.host(8, []string{"db"}, workJob("orders-report", sem, nil),
		workJob("invoices", sem, func(i int) error {
			if i%7 == 3 {
				return &pageError{fmt.Sprintf("page %d: invoice 10%02d: customer has no billing address", i, i)}
			}
			return nil
		}))
	done := f.start("orders-report", workArgs{N: 40, SleepMS: 20})
	if _, err := f.mr.Wait(context.Background(), done); err != nil {
		t.Fatal(err)
	}
	failed := f.start("invoices", workArgs{N: 30, SleepMS: 10})
	if _, err := f.mr.Wait(context.Background(), failed); err != nil {
		t.Fatal(err)
	}
	f.start("orders-report", workArgs{N: 3000, SleepMS: 150})
	// The chart shows 32 samples at the first limit, then 24 at the next.
	points := regexp.MustCompile(`class="held" points="([^"]*)"`)
	samples := func() int {
		_, body := f.get("/semaphore?name=db")
		m := points.FindStringSubmatch(body)
		if m == nil {
			return 0
		}
		return len(strings.Fields(m[1]))
	}
	testenv.WaitFor(t, 30*time.Second, "32 samples on the chart", func() bool { return samples() >= 32 })
	if err := sem.SetLimit(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "24 more samples on the chart", func() bool { return samples() >= 56 })
	for name, path := range map[string]string{"console-runs.png": "/runs", "console-semaphore.png": "/semaphore?name=db", "console-run.png": runPath(failed)} {
		run(t, ctx, "loading "+path, chromedp.Navigate(f.srv.URL+path), chromedp.Sleep(1500*time.Millisecond))
		png := value(t, ctx, "screenshot of "+path, chromedp.CaptureScreenshot())
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
