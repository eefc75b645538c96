// Package console is the web console `scheduler ui` serves: runs, jobs and
// semaphores of a batchmr deployment, server-rendered with html/template
// from what Redis holds, updated live by polling fragment endpoints, with
// cancel, retry and set-limit as CSRF-checked POSTs. With a token, it
// serves nothing but its login form and static assets without it.
//
//	con, err := console.New(console.Config{Redis: rdb, MapReduce: mr, SemaphorePrefix: "batchmr:sem"})
//	go con.Sample(ctx) // the semaphores' charts
//	defer con.Close()
//	http.ListenAndServe("127.0.0.1:8080", con)
//
// Everything read from Redis is rendered through html/template, which
// escapes it for its context: nothing from Redis is ever template.HTML.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/batchmr/batchmr/pkg/mapreduce"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a Console. Redis and MapReduce are required.
type Config struct {
	// Redis is the deployment's Redis: semaphores and published schedules
	// are read from it.
	Redis redis.UniversalClient
	// MapReduce reads runs and the catalogue, and cancels and retries runs.
	// It needs no jobs of its own.
	MapReduce *mapreduce.Client
	// Prefix is the key prefix of runs and the catalogue (mapreduce's
	// Config.Prefix), where `scheduler serve` publishes its schedules.
	// Default "batchmr".
	Prefix string
	// SemaphorePrefix is the semaphores' key prefix (semaphore's
	// Options.Prefix). Default semaphore.DefaultPrefix.
	SemaphorePrefix string
	// ReadOnly serves no mutation: no buttons or forms, and every POST is
	// refused with 403.
	ReadOnly bool
	// Token, when set, is required for every page, fragment and mutation
	// (not the static assets and the login form): from the login form
	// (which sets a session cookie) or an "Authorization: Bearer" header.
	// Without it a page redirects to the login page and the rest answer
	// 401. A client address that gives 5 wrong tokens within a minute is
	// refused (429) for a minute.
	Token string
	// PublicURL is the URL browsers reach the console at when that is a
	// name and not the address it listens on: a reverse proxy, a DNS name
	// (https://console.example.com). The console answers only requests
	// addressed to localhost, an IP address or this URL's host, so that a
	// web page cannot reach it through a name it controls (DNS
	// rebinding); forms posted from this URL's origin are the console's
	// own even when a proxy rewrote the Host header; and with https the
	// session cookie is Secure. Empty: browsers use an IP address or
	// localhost.
	PublicURL string
	// SampleEvery is how often Sample reads each semaphore's Stats for the
	// charts. Default 1s.
	SampleEvery time.Duration
	// History is how many samples each chart keeps. Default 300 (five
	// minutes at the default SampleEvery).
	History int
	// Logger receives errors reading Redis. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock of the wrong-token limit. Default time.Now.
	Now func() time.Time
}

// Console is an http.Handler serving the console. It is safe for
// concurrent use.
type Console struct {
	cfg    Config
	log    *slog.Logger
	mux    *http.ServeMux
	table  []route
	logins *limiter // wrong tokens per client address
	pages  map[string]*template.Template
	secret []byte // per process: derives the CSRF and session tokens
	csrf   string
	// cross refuses cross-origin POSTs (Sec-Fetch-Site, else Origin
	// against Host), trusting PublicURL's origin.
	cross      *http.CrossOriginProtection
	publicHost string // PublicURL's host name, lower case; "" if none
	secure     bool   // PublicURL is https: cookies are Secure

	mu       sync.Mutex
	sems     map[string]*semaphore.Semaphore
	history  map[string]*ring
	closed   bool
	sampling sync.WaitGroup

	// The sampler's failures, which only its goroutine touches: logged
	// when they start, then once a minute while they go on.
	sampleFailingSince, sampleWarned time.Time
}

// New returns a console over cfg's deployment, or an error naming what is
// missing from cfg.
func New(cfg Config) (*Console, error) {
	if cfg.Redis == nil || cfg.MapReduce == nil {
		return nil, errors.New("console: New: Config.Redis and Config.MapReduce are required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "batchmr"
	}
	if cfg.SemaphorePrefix == "" {
		cfg.SemaphorePrefix = semaphore.DefaultPrefix
	}
	if cfg.SampleEvery < 0 || cfg.History < 0 {
		return nil, errors.New("console: New: SampleEvery and History must not be negative: leave them zero for the defaults")
	}
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = time.Second
	}
	if cfg.History == 0 {
		cfg.History = 300
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{cfg: cfg, log: cfg.Logger, secret: make([]byte, 32), logins: newLimiter(cfg.Now),
		sems: map[string]*semaphore.Semaphore{}, history: map[string]*ring{}}
	if _, err := rand.Read(c.secret); err != nil {
		return nil, fmt.Errorf("console: New: drawing the CSRF secret: %w", err)
	}
	c.csrf = c.derive("csrf")
	c.cross = http.NewCrossOriginProtection()
	if cfg.PublicURL != "" {
		u, err := parsePublicURL(cfg.PublicURL)
		if err != nil {
			return nil, fmt.Errorf("console: New: %w", err)
		}
		if err := c.cross.AddTrustedOrigin(u.Scheme + "://" + u.Host); err != nil {
			return nil, fmt.Errorf("console: New: public URL %q: %w", cfg.PublicURL, err)
		}
		c.publicHost = strings.ToLower(u.Hostname())
		c.secure = u.Scheme == "https"
	}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

// Close stops Sample and releases the semaphore handles.
func (c *Console) Close() error {
	c.mu.Lock()
	c.closed = true
	sems := c.sems
	c.sems = map[string]*semaphore.Semaphore{}
	c.mu.Unlock()
	c.sampling.Wait()
	var errs []error
	for _, s := range sems {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

func (c *Console) derive(what string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(what))
	return hex.EncodeToString(m.Sum(nil))
}

// route is one pattern the console serves, and what it needs.
type route struct {
	pattern string
	access  access
	handler http.HandlerFunc
}

func (c *Console) routes() {
	static, _ := fs.Sub(staticFS, "static")
	c.table = []route{
		{"GET /static/", open, http.StripPrefix("/static/", http.FileServerFS(static)).ServeHTTP},
		{"GET /login", open, c.page("login", c.loginData)},
		{"POST /login", open, c.form(c.login)},
		{"GET /{$}", page, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/runs", http.StatusSeeOther)
		}},
		{"GET /runs", page, c.page("runs", c.runsData)},
		{"GET /runs/live", fragment, c.fragment("runs", c.runsData)},
		{"GET /run", page, c.page("run", c.runData)},
		{"GET /run/live", fragment, c.fragment("run", c.runLiveData)},
		{"GET /jobs", page, c.page("jobs", c.jobsData)},
		{"GET /jobs/live", fragment, c.fragment("jobs", c.jobsData)},
		{"GET /semaphores", page, c.page("semaphores", c.semaphoresData)},
		{"GET /semaphores/live", fragment, c.fragment("semaphores", c.semaphoresData)},
		{"GET /semaphore", page, c.page("semaphore", c.semaphoreData)},
		{"GET /semaphore/live", fragment, c.fragment("semaphore", c.semaphoreData)},
		{"POST /run/cancel", mutation, c.change(c.cancel)},
		{"POST /run/retry", mutation, c.change(c.retry)},
		{"POST /semaphore/limit", mutation, c.change(c.setLimit)},
		{"/", page, func(w http.ResponseWriter, r *http.Request) {
			c.fail(w, r, http.StatusNotFound, "No page at "+r.URL.Path+": the console has runs, jobs and semaphores.")
		}},
	}
	c.mux = http.NewServeMux()
	for _, rt := range c.table {
		c.mux.HandleFunc(rt.pattern, c.guard(rt.access, rt.handler))
	}
}

// ServeHTTP serves the console's pages, fragments, assets and mutations.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Nothing is loaded from elsewhere, nothing runs inline, and no other
	// site may frame the console (clickjacking its buttons).
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	if !c.hostAllowed(r.Host) {
		c.fail(w, r, http.StatusMisdirectedRequest, fmt.Sprintf("Refused: this console answers to localhost, IP addresses and the host of its public URL, and was reached as %q. If that is the name you use for it, start it with --public-url (for instance --public-url https://%s).", r.Host, r.Host))
		return
	}
	c.mux.ServeHTTP(w, r)
}

// CheckPublicURL reports what is wrong with s as Config.PublicURL.
func CheckPublicURL(s string) error {
	_, err := parsePublicURL(s)
	return err
}

func parsePublicURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("public URL %q: give the scheme and host browsers use, and nothing more, such as https://console.example.com", s)
	}
	return u, nil
}

// hostAllowed reports whether a request addressed to host (the Host
// header) may be served. A page of another site can make a browser send
// requests here through a name it controls that resolves to this address
// (DNS rebinding), and they would pass for the console's own; such a
// name is never localhost, an IP address or the public URL's host.
func (c *Console) hostAllowed(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"))
	switch {
	case name == "":
		return false
	case name == "localhost", net.ParseIP(name) != nil:
		return true
	default:
		return c.publicHost != "" && name == c.publicHost
	}
}

// statusError is an error with the HTTP status it deserves.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

func notFound(format string, args ...any) error {
	return &statusError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return &statusError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// view is what every page's template gets.
type view struct {
	Page      string // the template's name, for the navigation
	Title     string
	Live      string // the URL of the page's live fragment
	CSRF      string
	ReadOnly  bool
	CanMutate bool   // not read-only, and the token (if any) was given
	NeedLogin bool   // a token is required and was not given (open pages only)
	Notice    string // what the last mutation did
	Problem   string // why the last mutation was refused
	Data      any
}

// loader reads what a page shows; it returns a *statusError for the
// request's own faults (an unknown run: 404).
type loader func(ctx context.Context, r *http.Request) (title, live string, data any, err error)

func (c *Console) view(r *http.Request, name string) *view {
	authed := c.authorized(r)
	return &view{Page: name, CSRF: c.csrf, ReadOnly: c.cfg.ReadOnly,
		CanMutate: !c.cfg.ReadOnly && authed, NeedLogin: !c.cfg.ReadOnly && !authed,
		Notice: notices[r.URL.Query().Get("done")]}
}

// notices are the messages a mutation's redirect may ask for: a fixed
// set, so that a link cannot make the console say anything else.
var notices = map[string]string{
	"cancelled": "Run cancelled.",
	"retried":   "Run resumed: its pages that did not succeed (failed, or not run before it stopped) run again; those done are kept.",
	"limit":     "Limit changed.",
	"login":     "Logged in: you can change things now.",
}

func (c *Console) page(name string, load loader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := c.view(r, name)
		if err := c.load(r, v, load); err != nil {
			c.failWith(w, r, err)
			return
		}
		c.render(w, http.StatusOK, name, "layout", v)
	}
}

func (c *Console) fragment(name string, load loader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := c.view(r, name)
		if err := c.load(r, v, load); err != nil {
			var se *statusError
			code := http.StatusBadGateway
			if errors.As(err, &se) {
				code = se.code
			}
			http.Error(w, err.Error(), code)
			return
		}
		c.render(w, http.StatusOK, name, "live", v)
	}
}

func (c *Console) load(r *http.Request, v *view, load loader) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	title, live, data, err := load(ctx, r)
	v.Title, v.Live, v.Data = title, live, data
	return err
}

func (c *Console) render(w http.ResponseWriter, code int, name, tmpl string, v *view) {
	var b strings.Builder
	if err := c.pages[name].ExecuteTemplate(&b, tmpl, v); err != nil {
		c.log.Error("console: rendering a page", "page", name, "error", err)
		http.Error(w, "console: rendering "+name+" failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

// failWith renders err as an error page: its own status for a
// *statusError, 502 (Redis did not answer as it should) for the rest.
func (c *Console) failWith(w http.ResponseWriter, r *http.Request, err error) {
	var se *statusError
	if errors.As(err, &se) {
		c.fail(w, r, se.code, se.msg)
		return
	}
	c.log.Error("console: reading Redis", "path", r.URL.Path, "error", err)
	c.fail(w, r, http.StatusBadGateway, "Reading Redis failed: "+err.Error())
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	v := c.view(r, "error")
	v.Title = http.StatusText(code)
	v.Data = msg
	c.render(w, code, "error", "layout", v)
}

func (c *Console) parseTemplates() error {
	funcs := template.FuncMap{
		"ago":      ago,
		"until":    until,
		"clock":    clock,
		"duration": duration,
		"code":     func(id string, v any) clipped { return clip(id, false, v) },
		"pre":      func(id string, v any) clipped { return clip(id, true, v) },
	}
	c.pages = map[string]*template.Template{}
	for _, name := range []string{"runs", "run", "jobs", "semaphores", "semaphore", "login", "error"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("console: parsing the %s page: %w", name, err)
		}
		c.pages[name] = t
	}
	return nil
}

func clock(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func duration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return duration(time.Since(t)) + " ago"
}

func until(t time.Time) string {
	if d := time.Until(t); d > 0 {
		return "in " + duration(d)
	}
	return "due now"
}
