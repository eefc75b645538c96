package semaphore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Every script is lib.lua followed by its own body, so that the key layout,
// the clock, purge and grant are written once. See scripts/lib.lua for the
// KEYS and ARGV every script shares.
//
// The scripts run as functions of one Redis function library (Redis >= 7)
// when the server allows it, and as EVALSHA scripts otherwise. Both run the
// same code; a function skips re-creating lib.lua's helpers on every call,
// about a fifth of a script's time on a busy server (docs/semaphore.md).
var (
	//go:embed scripts/lib.lua
	luaLib string
	//go:embed scripts/acquire.lua
	luaAcquire string
	//go:embed scripts/release.lua
	luaRelease string
	//go:embed scripts/refresh.lua
	luaRefresh string
	//go:embed scripts/setlimit.lua
	luaSetLimit string
	//go:embed scripts/stats.lua
	luaStats string
	//go:embed scripts/setauto.lua
	luaSetAuto string
	//go:embed scripts/adapt.lua
	luaAdapt string
	//go:embed scripts/control.lua
	luaControl string

	// An acquire that only queues, behind a full semaphore, takes a short
	// step instead of the whole script (queue_short in lib.lua).
	scriptAcquire = newScript("acquire", luaAcquire).first("local r = queue_short(ARGV)\nif r then return r end\n")
	// Releasing, refreshing and looking grow no memory (a holder leaves, a
	// waiter becomes a holder, deadlines move), so they run when Redis is
	// over its maxmemory: holders keep their permits and hand them on.
	// Taking a new place in the queue does not.
	//
	// A release first tries the short hand-off to the queue's head
	// (handoff in lib.lua).
	scriptRelease = newScript("release", luaRelease, "allow-oom").first(handoffFirst)
	// A release that carries new waiters (enqueue.go) takes new places in
	// the queue, so it is not flagged allow-oom: over maxmemory Redis
	// refuses it as a function, and by EVALSHA at its first write that may
	// grow memory (unless its purge wrote first, as for acquire), and the
	// permit is then given back by scriptRelease alone.
	scriptCarry    = newScript("carry", luaRelease).first(handoffFirst)
	scriptRefresh  = newScript("refresh", luaRefresh, "allow-oom")
	scriptSetLimit = newScript("setlimit", luaSetLimit)
	scriptStats    = newScript("stats", luaStats, "allow-oom")
	scriptSetAuto  = newScript("setauto", luaSetAuto)
	scriptAdapt    = newScript("adapt", luaAdapt)
	scriptControl  = newScript("control", luaControl)

	// handoffFirst is release's short step: a hand-off needs nothing else
	// unless it carries waiters that the whole release must queue.
	handoffFirst = "if handoff(ARGV) then return finish(handed) end\n"

	allScripts = []*script{scriptAcquire, scriptRelease, scriptCarry, scriptRefresh, scriptSetLimit, scriptStats, scriptSetAuto, scriptAdapt, scriptControl}

	// defaultLibrary is versioned by a hash of its own code, so that
	// processes running different versions of batchmr against one Redis each
	// call their own functions, and an upgrade never replaces a running
	// version's code.
	defaultLibrary = newLibrary(codeVersion())
)

// script is one semaphore operation. Its EVALSHA form is eval; its function
// form is named by a library and registered with flags (Redis function
// flags, such as "allow-oom"; EVALSHA scripts carry none, to run on
// Redis < 7 too).
//
// prologue, if any, is the script's short step: it runs after bind and
// before begin (lib.lua), and may return the reply itself.
type script struct {
	name     string
	body     string
	flags    []string
	prologue string
	src      string // the EVALSHA form's code
	eval     *redis.Script
}

func newScript(name, body string, flags ...string) *script {
	sc := &script{name: name, body: body, flags: flags}
	sc.compile()
	return sc
}

// first sets sc's prologue.
func (sc *script) first(prologue string) *script {
	sc.prologue = prologue
	sc.compile()
	return sc
}

func (sc *script) compile() {
	// Before Redis 5, a script that reads TIME and then writes must switch
	// to effects replication first.
	sc.src = "if redis.replicate_commands then pcall(redis.replicate_commands) end\n" +
		luaLib + "\nbind(KEYS, ARGV)\n" + sc.prologue + "begin()\n" + wrapBody(sc.body)
	sc.eval = redis.NewScript(sc.src)
}

// wrapBody runs a script's body as a closure and passes its reply through
// lib.lua's finish, which records what the call changed (whichever of the
// body's returns it took).
func wrapBody(body string) string {
	return "return finish((function()\n" + body + "\nend)())"
}

// library is every script as one Redis function library.
type library struct {
	name      string
	code      string
	functions map[*script]string
}

func newLibrary(version string) *library {
	lib := &library{name: "batchmr_semaphore_" + version, functions: map[*script]string{}}
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n%s\n", lib.name, luaLib)
	for _, sc := range allScripts {
		fn := "batchmr_sem_" + sc.name + "_" + version
		lib.functions[sc] = fn
		flags := ""
		for _, f := range sc.flags {
			flags += "'" + f + "', "
		}
		fmt.Fprintf(&b, "redis.register_function{function_name = '%s', flags = {%s}, callback = function(KEYS, ARGV)\nbind(KEYS, ARGV)\n%sbegin()\n%s\nend}\n", fn, flags, sc.prologue, wrapBody(sc.body))
	}
	lib.code = b.String()
	return lib
}

// codeVersion hashes the whole library, wrapper included, with a fixed
// placeholder where its version goes.
func codeVersion() string {
	sum := sha1.Sum([]byte(newLibrary("v").code))
	return hex.EncodeToString(sum[:])[:12]
}

// Statuses returned by acquire.lua.
const (
	acquireGranted  = 1
	acquireQueued   = 0
	acquireFull     = 2
	acquireTooHeavy = -1
	// A retry found its token unknown to Redis: see acquire.
	acquireUnknown = 3
)

// Statuses returned by release.lua.
const (
	releaseUnknown = 0
	releaseHeld    = 1
	releaseQueued  = 2
	// The token held a permit, which went straight to the queue's head
	// (handoff in scripts/lib.lua).
	releaseHanded = 3
)
