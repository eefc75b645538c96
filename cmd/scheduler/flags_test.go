package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestNegativeNumbersAreArgumentsNotFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		pos     []string
		key     string
		verbose bool
	}{
		{[]string{"set", "db", "-1"}, []string{"set", "db", "-1"}, "", false},
		{[]string{"set", "-2.5", "db", "--verbose"}, []string{"set", "-2.5", "db"}, "", true},
		{[]string{"--verbose", "set", "db", "-1"}, []string{"set", "db", "-1"}, "", true},
		{[]string{"run", "--key", "-1", "job"}, []string{"run", "job"}, "-1", false},               // a flag's value
		{[]string{"run", "--verbose", "-1"}, []string{"run", "-1"}, "", true},                      // a bool flag takes none
		{[]string{"--key", "k", "--", "--verbose", "-x"}, []string{"--verbose", "-x"}, "k", false}, // after --, all positional
		{[]string{"a", "--key=-1", "b"}, []string{"a", "b"}, "-1", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		key := fs.String("key", "", "")
		verbose := fs.Bool("verbose", false, "")
		pos, err := parse(fs, "", tc.args, io.Discard)
		if err != nil || !slices.Equal(pos, tc.pos) || *key != tc.key || *verbose != tc.verbose {
			t.Errorf("parse(%q) = %q, key %q, verbose %v; want %q, key %q, verbose %v", tc.args, pos, *key, *verbose, tc.pos, tc.key, tc.verbose)
		}
	}
}
