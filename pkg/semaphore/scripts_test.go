package semaphore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batchmr/batchmr/internal/tests/testenv"
	"github.com/batchmr/batchmr/pkg/semaphore"
	"github.com/redis/go-redis/v9"
)

// serverHasFunctions reports whether the server is Redis 7 or later.
func serverHasFunctions(t *testing.T, rdb redis.UniversalClient) bool {
	t.Helper()
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
			return major >= 7
		}
	}
	t.Fatalf("no redis_version in INFO server: %q", info)
	return false
}

func libraryLoaded(t *testing.T, rdb redis.UniversalClient, name string) bool {
	t.Helper()
	libs, err := rdb.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: name}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(libs) == 1
}

// ownLibrary gives s a function library that only this test uses, deleted
// when the test ends, and returns its name.
func ownLibrary(t *testing.T, rdb redis.UniversalClient, s *semaphore.Semaphore) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := s.UseOwnLibrary("test" + hex.EncodeToString(b[:]))
	t.Cleanup(func() { rdb.FunctionDelete(context.Background(), name) })
	return name
}

// deleteLibrary removes a library, as a restart without persistence would.
func deleteLibrary(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	err := rdb.FunctionDelete(context.Background(), name).Err()
	if err != nil && !strings.Contains(err.Error(), "not found") {
		t.Fatal(err)
	}
}

// cycle acquires and releases a permit, checking the commands s sent.
func cycle(t *testing.T, s *semaphore.Semaphore, counter *cmdCounter, wantCmd string) {
	t.Helper()
	before := counter.snapshot()
	p := mustAcquire(t, s)
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := counter.snapshot()
	if after[wantCmd] <= before[wantCmd] {
		t.Errorf("no %s among the commands sent: %v -> %v", wantCmd, before, after)
	}
}

func countedClient(t *testing.T, opt *redis.Options) (*redis.Client, *cmdCounter) {
	t.Helper()
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	counter := &cmdCounter{n: map[string]int{}}
	rdb.AddHook(counter)
	return rdb, counter
}

func skipUnlessFunctions(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	if semaphore.ForcedEval() {
		t.Skip("BATCHMR_SEMAPHORE_SCRIPTS=eval: this run tests the EVALSHA path only")
	}
	if !serverHasFunctions(t, rdb) {
		t.Skip("Redis < 7 has no functions; the scripts run with EVALSHA")
	}
}

// A server that loses the library (a restart without persistence, FUNCTION
// FLUSH, a failover to a node that never had it) gets it back on the next
// call, and that call succeeds.
func TestFunctionLibraryIsReloadedWhenTheServerLosesIt(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	skipUnlessFunctions(t, rdb)
	opt, _ := redis.ParseURL(testenv.RedisURL(t))
	crdb, counter := countedClient(t, opt)
	s := newSem(t, crdb, prefix, semaphore.Options{Limit: 1})
	lib := ownLibrary(t, rdb, s)

	cycle(t, s, counter, "fcall")
	if !libraryLoaded(t, rdb, lib) || !s.UsesFunctions() {
		t.Fatal("the first call did not load the library")
	}
	p := mustAcquire(t, s)
	deleteLibrary(t, rdb, lib)
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("release after the library vanished: %v", err)
	}
	if !libraryLoaded(t, rdb, lib) {
		t.Fatal("the library was not reloaded")
	}
	cycle(t, s, counter, "fcall")
	if !s.UsesFunctions() {
		t.Fatal("the handle stopped using functions")
	}
	if n := counter.snapshot()["evalsha"]; n != 0 {
		t.Errorf("%d EVALSHA calls on a server with functions", n)
	}
}

// Where an ACL forbids FCALL, or loading the library, the semaphore runs
// the same code with EVALSHA instead of failing.
func TestScriptsFallBackToEvalWhereFunctionsAreForbidden(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	skipUnlessFunctions(t, rdb)
	ctx := context.Background()
	for _, tc := range []struct{ name, rules string }{
		{"no FCALL", "-fcall"},
		{"no FUNCTION LOAD", "-function"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := strings.NewReplacer(":", "-", "/", "-").Replace(prefix) + strings.ReplaceAll(tc.rules, "-", "")
			if err := rdb.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", tc.rules).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Do(context.Background(), "ACL", "DELUSER", user) })
			opt, _ := redis.ParseURL(testenv.RedisURL(t))
			opt.Username, opt.Password = user, "pw"
			crdb, counter := countedClient(t, opt)
			s := newSem(t, crdb, prefix, semaphore.Options{Limit: 1})
			lib := ownLibrary(t, rdb, s)

			cycle(t, s, counter, "evalsha")
			cycle(t, s, counter, "evalsha")
			if s.UsesFunctions() {
				t.Error("still using functions after the server refused them")
			}
			if libraryLoaded(t, rdb, lib) {
				t.Error("the library was loaded by a user without the right to")
			}
		})
	}
}

// A server without FCALL and FUNCTION answers as Redis 6 does ("unknown
// command"), not with NOPERM as an ACL does: the semaphore must recognise
// that too, run everything with EVALSHA, and hand permits over as usual.
func TestScriptsRunWithEvalOnAServerWithoutFunctions(t *testing.T) {
	t.Parallel()
	if semaphore.ForcedEval() {
		t.Skip("BATCHMR_SEMAPHORE_SCRIPTS=eval: this test checks how the handle detects a server without functions")
	}
	rdb, _ := testenv.PrivateRedis(t, "--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
	ctx := context.Background()
	if err := rdb.Do(ctx, "FCALL", "x", "0").Err(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		t.Fatalf("FCALL on the test's server = %v, want an unknown-command error", err)
	}
	counter := &cmdCounter{n: map[string]int{}}
	rdb.AddHook(counter)
	a := newSem(t, rdb, "nofn", semaphore.Options{Limit: 1})
	b := newSem(t, rdb, "nofn", semaphore.Options{Limit: 1})

	cycle(t, a, counter, "evalsha")
	if a.UsesFunctions() {
		t.Error("the handle still uses functions on a server without them")
	}
	p := mustAcquire(t, a)
	got := acquireQueued(t, b, a, 1)
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := receiveGrant(t, got, 10*time.Second, "the waiter, after the release")
	if q.Fence() <= p.Fence() {
		t.Errorf("fence after the hand-off = %d, want > %d", q.Fence(), p.Fence())
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := counter.snapshot()["fcall"]; n > 2 {
		t.Errorf("%d FCALL attempts: the handle should stop trying after the first unknown-command answer of each handle", n)
	}
}
