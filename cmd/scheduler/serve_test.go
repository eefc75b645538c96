package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestEverySpecTicksAtMultiplesOfItsDurationSinceTheEpoch(t *testing.T) {
	next, err := parseSpec("@every 10m")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 21, 6, 7, 30, 0, time.UTC)
	if got, want := next(now).UTC(), time.Date(2026, 11, 21, 6, 10, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("@every 10m after %v: %v, want %v", now, got, want)
	}
	if got, want := next(time.Date(2026, 11, 21, 6, 10, 0, 0, time.UTC)).UTC(), time.Date(2026, 11, 21, 6, 20, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("@every 10m on a tick: %v, want the next one %v", got, want)
	}
	cron, err := parseSpec("0 6 * * 1-5")
	if err != nil {
		t.Fatal(err)
	}
	// 2026-11-21 is a Saturday: the next weekday 06:00 UTC is Monday's.
	if got, want := cron(now), time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("cron 0 6 * * 1-5 after %v: %v, want %v", now, got, want)
	}
	for _, bad := range []string{"@every 1ms", "@every soon", "61 * * * *", ""} {
		if _, err := parseSpec(bad); err == nil {
			t.Errorf("parseSpec(%q) accepted a bad spec", bad)
		}
	}
}

// A cron spec may name its time zone: CRON_TZ=Area/City before the five
// fields. Its ticks follow that zone's clock, summer time included. (The
// scheduler embeds the zone database for images without zoneinfo; a host
// with zoneinfo cannot tell, so this test does not prove that part.)
func TestACronSpecMayNameItsTimeZone(t *testing.T) {
	berlin, err := parseSpec("CRON_TZ=Europe/Berlin 0 6 * * *")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ after, want time.Time }{
		// November: Berlin is UTC+1, so 06:00 there is 05:00 UTC.
		{time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)},
		// July: UTC+2, so 04:00 UTC.
		{time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC), time.Date(2026, 7, 2, 4, 0, 0, 0, time.UTC)},
	} {
		if got := berlin(tc.after); !got.Equal(tc.want) {
			t.Errorf("CRON_TZ=Europe/Berlin 0 6 * * * after %v: %v, want %v", tc.after, got.UTC(), tc.want)
		}
	}
	if _, err := parseSpec("CRON_TZ=Mars/Olympus 0 2 * * *"); err == nil {
		t.Error("parseSpec accepted an unknown time zone")
	}
}

// The console's address as printed is one a browser can open and the
// console answers to: a listener on every interface is shown by an IP
// address of this host (the console refuses other host names), not as
// [::]; a public URL, as it is.
func TestTheConsoleURLOfAnAllInterfacesListenerIsOneTheConsoleAnswers(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:8080": "http://127.0.0.1:8080/",
		"[::1]:8080":     "http://[::1]:8080/",
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := consoleURL(a, "", false); got != want {
			t.Errorf("listening on %s: %q, want %q", addr, got, want)
		}
	}
	for _, addr := range []string{"0.0.0.0:8080", "[::]:18090"} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		got := consoleURL(a, "", false)
		u, err := url.Parse(got)
		if err != nil || (net.ParseIP(u.Hostname()) == nil && u.Hostname() != "localhost") || net.ParseIP(u.Hostname()).IsUnspecified() || u.Port() != strconv.Itoa(a.Port) {
			t.Errorf("listening on %s: %q, want this host's IP address (or localhost) and the port", addr, got)
		}
	}
	a, _ := net.ResolveTCPAddr("tcp", "0.0.0.0:8080")
	if got := consoleURL(a, "https://batchmr.example.com", false); got != "https://batchmr.example.com/" {
		t.Errorf("with a public URL: %q, want it", got)
	}
	a, _ = net.ResolveTCPAddr("tcp", "127.0.0.1:8443")
	if got := consoleURL(a, "", true); got != "https://127.0.0.1:8443/" {
		t.Errorf("serving TLS: %q, want https://127.0.0.1:8443/", got)
	}
}

// Redis's refusal over maxmemory names no fix; the command's error does.
func TestAnOOMRefusalGetsItsFix(t *testing.T) {
	err := fmt.Errorf("mapreduce: start: %w", errors.New("OOM command not allowed when used memory > 'maxmemory'."))
	if got := trim(err); !strings.HasPrefix(got, "start: OOM") || !strings.Contains(got, "raise it (CONFIG SET maxmemory") {
		t.Errorf("trim: %q, want the refusal and the fix", got)
	}
	if got := trim(errors.New("mapreduce: other")); got != "other" {
		t.Errorf("trim of another error: %q", got)
	}
}
