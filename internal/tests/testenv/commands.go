package testenv

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var monitorWord = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)

// MonitorCommands records, from now until the returned stop is called,
// the commands rdb's server runs that mention prefix (a test's key
// prefix), each as its words, command first, as MONITOR quotes them. stop
// returns once MONITOR has shown every command sent before it: MONITOR's
// stream lags the commands, so stop sends one last and waits to see it.
func MonitorCommands(t testing.TB, rdb *redis.Client, prefix string) (stop func() [][]string) {
	t.Helper()
	marker := prefix + ":monitor-end"
	seenMarker := make(chan struct{})
	var mu sync.Mutex
	var cmds [][]string
	end := Monitor(t, "tcp", rdb.Options().Addr, func(line string) {
		switch {
		case strings.Contains(line, marker):
			close(seenMarker)
			return
		case !strings.Contains(line, prefix):
			return
		}
		var words []string
		for _, m := range monitorWord.FindAllStringSubmatch(line, -1) {
			words = append(words, m[1])
		}
		mu.Lock()
		cmds = append(cmds, words)
		mu.Unlock()
	})
	return func() [][]string {
		t.Helper()
		if err := rdb.Echo(context.Background(), marker).Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-seenMarker:
		case <-time.After(30 * time.Second):
			t.Fatal("testenv: MONITOR did not show a command sent 30 s ago")
		}
		end()
		mu.Lock()
		defer mu.Unlock()
		return cmds
	}
}

// ReadsWholeValue returns the first of cmds (as MonitorCommands records
// them) that reads a run record whole or reads its "args" or "result":
// an HGETALL of a run, an HGET or HMGET naming either field; nil if none.
func ReadsWholeValue(cmds [][]string) []string {
	for _, words := range cmds {
		if len(words) < 2 {
			continue
		}
		switch cmd := strings.ToUpper(words[0]); {
		case cmd == "HGETALL" && strings.Contains(words[1], "}:run:"),
			(cmd == "HGET" || cmd == "HMGET") && (slices.Contains(words[2:], "args") || slices.Contains(words[2:], "result")):
			return words
		}
	}
	return nil
}
