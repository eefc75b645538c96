package testenv

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogBuffer collects what loggers on many goroutines, or processes'
// output, write while a test reads it. The zero value is ready to use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Bytes returns a copy of what was written so far.
func (l *LogBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

// String returns what was written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Tail returns the last n lines written.
func (l *LogBuffer) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(l.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Records decodes what was written as the lines of a JSON slog handler,
// one record a line, failing t on a line that is not JSON.
func (l *LogBuffer) Records(t testing.TB) []map[string]any {
	t.Helper()
	return Records(t, l.Bytes())
}

// WaitForRecord returns the first JSON record whose line contains text,
// waiting up to d for one, and failing t if none comes.
func (l *LogBuffer) WaitForRecord(t testing.TB, d time.Duration, text string) map[string]any {
	t.Helper()
	var rec map[string]any
	WaitFor(t, d, "a log line with "+text, func() bool {
		for _, line := range bytes.Split(l.Bytes(), []byte("\n")) {
			if bytes.Contains(line, []byte(text)) {
				return json.Unmarshal(line, &rec) == nil
			}
		}
		return false
	})
	return rec
}

// Records decodes the lines of a JSON slog handler's output, one record a
// line (empty lines skipped), failing t on a line that is not JSON.
func Records(t testing.TB, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}
