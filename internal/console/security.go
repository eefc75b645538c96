package console

import (
	"context"
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"
)

// sessionCookie holds the proof that the browser was given the token.
const sessionCookie = "batchmr_ui_session"

// authorized reports whether r may mutate as far as the token goes: no
// token is configured, or r carries it (Authorization: Bearer) or the
// session cookie the login form set.
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

// session is the session cookie's value: derived from the token and the
// process's secret, so the cookie is not the token itself and dies with
// the process.
func (c *Console) session() string { return c.derive("session:" + c.cfg.Token) }

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// mutation wraps a POST handler in the checks every change needs: not
// read-only, from the console's own pages (origin and CSRF token), and,
// when needsToken, with the token.
func (c *Console) mutation(needsToken bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		switch {
		case c.cfg.ReadOnly:
			c.fail(w, r, http.StatusForbidden, "The console is read-only (scheduler ui --read-only): it changes nothing.")
		case c.cross.Check(r) != nil:
			c.fail(w, r, http.StatusForbidden, "Refused: the request came from another site. Use the console's own pages.")
		case r.ParseForm() != nil || !equal(r.PostFormValue("csrf"), c.csrf):
			c.fail(w, r, http.StatusForbidden, "Refused: the form's CSRF token is missing or stale (the console restarted?). Reload the page and try again.")
		case needsToken && !c.authorized(r):
			v := c.view(r, "login")
			v.Title = "Log in"
			v.Problem = "This console needs its token (BATCHMR_UI_TOKEN) to change things: log in first."
			v.Data = loginView{Next: localPath(r.Referer())}
			c.render(w, http.StatusUnauthorized, "login", "layout", v)
		default:
			h(w, r)
		}
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
	if !equal(r.PostFormValue("token"), c.cfg.Token) {
		v := c.view(r, "login")
		v.Title = "Log in"
		v.Problem = "Wrong token: give the value of BATCHMR_UI_TOKEN that `scheduler ui` was started with."
		v.Data = loginView{Next: next}
		c.render(w, http.StatusUnauthorized, "login", "layout", v)
		return
	}
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
