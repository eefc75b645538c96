package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// A command returns its outcome as an error, and its main alone turns it
// into an exit status with Exit: a command can then be run, and tested,
// without ending the process.

// UsageError is a bad command line: Exit prints it pointing at --help and
// returns 2.
type UsageError struct {
	msg string
	// unknownFlag: the flag package's "flag provided but not defined",
	// which WithUnknownFlagHint completes.
	unknownFlag bool
}

func (e *UsageError) Error() string { return e.msg }

// Usagef returns a *UsageError of the formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}

// WithUnknownFlagHint returns err with hint after its message when err is
// Parse's error for a flag the command does not define (what such a flag
// most likely meant), and err unchanged otherwise.
func WithUnknownFlagHint(err error, hint string) error {
	var u *UsageError
	if !errors.As(err, &u) || !u.unknownFlag {
		return err
	}
	return &UsageError{msg: u.msg + ": " + hint}
}

// ExitCode is an outcome the command has already reported on its own
// streams: Exit prints nothing and returns the code (1 for a run followed
// to a failure, 130 for a run no longer followed after Ctrl-C).
type ExitCode int

func (c ExitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// Exit returns the exit status of a command's outcome err, after printing
// it on stderr as one line that starts with cmd (the command's name): 0
// for nil and for flag.ErrHelp (Parse printed the usage); c for an
// ExitCode c, printing nothing; 2 for a *UsageError, as "cmd: msg (see
// --help)"; 1 for any other error, as "cmd: msg".
func Exit(cmd string, err error, stderr io.Writer) int {
	var (
		code  ExitCode
		usage *UsageError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%s: %s (see --help)\n", cmd, usage.msg)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %s\n", cmd, err)
	return 1
}

// Parse parses a command's flags. --help prints usage and the flags'
// defaults on stdout and returns flag.ErrHelp (Exit makes it 0); a bad
// flag returns a *UsageError. Neither shows a URL's password: a default
// may come from the environment (REDIS_URL), and the flag package quotes
// a bad value whole.
func Parse(fs *flag.FlagSet, usage string, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		fs.VisitAll(func(f *flag.Flag) { f.DefValue = Redact(f.DefValue) })
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return flag.ErrHelp
	}
	if err != nil {
		return &UsageError{msg: Redact(err.Error()), unknownFlag: strings.HasPrefix(err.Error(), "flag provided but not defined")}
	}
	return nil
}
