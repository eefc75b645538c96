package app_test

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/batchmr/batchmr/internal/app"
)

func TestExitPrintsOneLineAndReturnsTheOutcomesStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		code   int
		stderr string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{errors.New("cannot reach Redis"), 1, "cmd: cannot reach Redis\n"},
		{fmt.Errorf("run x: %w", errors.New("failed")), 1, "cmd: run x: failed\n"},
		{app.Usagef("missing %s", "RUN"), 2, "cmd: missing RUN (see --help)\n"},
		{fmt.Errorf("wrapped: %w", app.Usagef("bad")), 2, "cmd: bad (see --help)\n"},
		{app.ExitCode(130), 130, ""},
		{app.ExitCode(1), 1, ""},
	} {
		var stderr strings.Builder
		if code := app.Exit("cmd", tc.err, &stderr); code != tc.code || stderr.String() != tc.stderr {
			t.Errorf("Exit(%v): %d, %q; want %d, %q", tc.err, code, stderr.String(), tc.code, tc.stderr)
		}
	}
}

func TestParseReturnsHelpAndUsageErrorsWithoutAPassword(t *testing.T) {
	t.Parallel()
	newFlags := func() *flag.FlagSet {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.String("redis-url", "redis://u:secretpw@host:6379/0", "Redis URL")
		fs.Int("n", 1, "a number")
		return fs
	}
	var out strings.Builder
	err := app.Parse(newFlags(), "usage text\n", []string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(out.String(), "usage text\n") ||
		!strings.Contains(out.String(), "-redis-url") || strings.Contains(out.String(), "secretpw") {
		t.Errorf("--help: %v, stdout %q; want flag.ErrHelp, the usage and the flags without the password", err, out.String())
	}
	out.Reset()
	err = app.Parse(newFlags(), "usage\n", []string{"--n", "redis://u:otherpw@h/0"}, &out)
	var usage *app.UsageError
	if !errors.As(err, &usage) || strings.Contains(err.Error(), "otherpw") || out.Len() > 0 {
		t.Errorf("a bad value: %v, stdout %q; want a *UsageError without the password, and no output", err, out.String())
	}
	err = app.WithUnknownFlagHint(app.Parse(newFlags(), "usage\n", []string{"--nope"}, &out), "try --n")
	if !errors.As(err, &usage) || !strings.HasSuffix(err.Error(), ": try --n") {
		t.Errorf("an unknown flag with a hint: %v; want a *UsageError ending with the hint", err)
	}
	if err := app.WithUnknownFlagHint(app.Usagef("missing RUN"), "try --n"); err.Error() != "missing RUN" {
		t.Errorf("another usage error with a hint: %q; want it unchanged", err)
	}
}
