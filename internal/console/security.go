package console

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// sessionCookie holds the proof that the browser was given the token.
const sessionCookie = "batchmr_ui_session"

// access is what a route needs from a request when a token is set.
type access int

const (
	open     access = iota // nothing: the static assets and the login form
	page                   // the token; without it, a redirect to the login page
	fragment               // the token; without it, 401 and no data
	mutation               // the token; without it, 401 and the login form
)

// authorized reports whether r may read and change things as far as the
// token goes: no token is configured, or r carries it (Authorization:
// Bearer) or the session cookie the login form set.
func (c *Console) authorized(r *http.Request) bool {
	if c.cfg.Token == "" {
		return true
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return equal(bearer, c.cfg.Token)
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		return equal(ck.Value, c.session())
	}
	return false
}

// guard serves h to the requests that kind allows: with a token set,
// only to those that carry it. A wrong bearer token counts as a failed
// login for the client's address; a stale session cookie (the console
// restarted) does not, since every live fragment would send it again.
func (c *Console) guard(kind access, h http.HandlerFunc) http.HandlerFunc {
	if kind == open {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.Token == "" {
			h(w, r)
			return
		}
		kind := kind
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			if wait, blocked := c.logins.blocked(r); blocked {
				c.tooMany(w, r, wait, localPath(r.Referer()))
				return
			}
			if !equal(bearer, c.cfg.Token) {
				c.logins.fail(r)
				if kind == page {
					kind = fragment // a script: 401, not the login form
				}
			}
		}
		if c.authorized(r) {
			h(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		switch kind {
		case page:
			// No body: even the link a redirect usually carries is left out.
			w.Header().Set("Location", "/login?"+url.Values{"next": {r.URL.RequestURI()}}.Encode())
			w.WriteHeader(http.StatusSeeOther)
		case fragment:
			w.Header().Set("WWW-Authenticate", `Bearer realm="batchmr console"`)
			http.Error(w, "Unauthorized: log in at /login, or send \"Authorization: Bearer\" with the console's token (BATCHMR_UI_TOKEN).", http.StatusUnauthorized)
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="batchmr console"`)
			v := c.view(r, "login")
			v.Title = "Log in"
			v.Problem = "This console needs its token (BATCHMR_UI_TOKEN): log in first."
			v.Data = loginView{Next: localPath(r.Referer())}
			c.render(w, http.StatusUnauthorized, "login", "layout", v)
		}
	}
}

// tooMany answers a client that gave too many wrong tokens: 429, when to
// try again, and the login form leading to next.
func (c *Console) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, next string) {
	secs := int((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	v := c.view(r, "login")
	v.Title = "Log in"
	v.Problem = fmt.Sprintf("Too many wrong tokens from your address: try again in %ds.", secs)
	v.Data = loginView{Next: next}
	c.render(w, http.StatusTooManyRequests, "login", "layout", v)
}

// session is the session cookie's value: derived from the token and the
// process's secret, so the cookie is not the token itself and dies with
// the process.
func (c *Console) session() string { return c.derive("session:" + c.cfg.Token) }

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// form wraps a POST handler in the checks every form needs: from the
// console's own pages (origin and CSRF token).
func (c *Console) form(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		switch {
		case c.cross.Check(r) != nil:
			c.fail(w, r, http.StatusForbidden, "Refused: the request came from another site. Use the console's own pages.")
		case r.ParseForm() != nil || !equal(r.PostFormValue("csrf"), c.csrf):
			c.fail(w, r, http.StatusForbidden, "Refused: the form's CSRF token is missing or stale (the console restarted?). Reload the page and try again.")
		default:
			h(w, r)
		}
	}
}

// change wraps a POST handler that changes the deployment: refused when
// read-only, else a form.
func (c *Console) change(h http.HandlerFunc) http.HandlerFunc {
	h = c.form(h)
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "The console is read-only (scheduler ui --read-only): it changes nothing.")
			return
		}
		h(w, r)
	}
}

type loginView struct{ Next string }

func (c *Console) loginData(_ context.Context, r *http.Request) (string, string, any, error) {
	return "Log in", "", loginView{Next: localPath(r.URL.Query().Get("next"))}, nil
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	next := localPath(r.PostFormValue("next"))
	if c.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if wait, blocked := c.logins.blocked(r); blocked {
		c.tooMany(w, r, wait, next)
		return
	}
	if !equal(r.PostFormValue("token"), c.cfg.Token) {
		c.logins.fail(r)
		v := c.view(r, "login")
		v.Title = "Log in"
		v.Problem = "Wrong token: give the value of BATCHMR_UI_TOKEN that `scheduler ui` was started with."
		v.Data = loginView{Next: next}
		c.render(w, http.StatusUnauthorized, "login", "layout", v)
		return
	}
	c.logins.forget(r)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: c.session(), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || c.secure})
	http.Redirect(w, r, withDone(next, "login"), http.StatusSeeOther)
}

// localPath returns s if it is a path on this console (from a Referer or a
// next parameter), else "/runs": a login must not redirect off-site.
func localPath(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Path == "" || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return "/runs"
	}
	q := u.Query()
	q.Del("done")
	u.RawQuery = q.Encode()
	return (&url.URL{Path: u.Path, RawQuery: u.RawQuery}).String()
}

// withDone adds the notice a redirect asks for to a local path.
func withDone(path, done string) string {
	u, _ := url.Parse(path)
	q := u.Query()
	q.Set("done", done)
	u.RawQuery = q.Encode()
	return u.String()
}
