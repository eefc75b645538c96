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
// same code; a function skips re-defining lib.lua's helpers on every call,
// which is most of a script's cost on a busy server (see docs/semaphore.md).
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

	scriptAcquire  = newScript("acquire", luaAcquire)
	scriptRelease  = newScript("release", luaRelease)
	scriptRefresh  = newScript("refresh", luaRefresh)
	scriptSetLimit = newScript("setlimit", luaSetLimit)
	scriptStats    = newScript("stats", luaStats)

	allScripts = []*script{scriptAcquire, scriptRelease, scriptRefresh, scriptSetLimit, scriptStats}

	// libraryVersion names this build's library and functions, so that
	// processes running different versions of batchmr against one Redis
	// each call their own code.
	libraryVersion = func() string {
		h := sha1.New()
		h.Write([]byte(luaLib))
		for _, sc := range allScripts {
			h.Write([]byte(sc.name + "\x00" + sc.body))
		}
		return hex.EncodeToString(h.Sum(nil))[:12]
	}()
	libraryName = "batchmr_semaphore_" + libraryVersion
	libraryCode = func() string {
		var b strings.Builder
		fmt.Fprintf(&b, "#!lua name=%s\n%s\n", libraryName, luaLib)
		for _, sc := range allScripts {
			sc.function = "batchmr_sem_" + sc.name + "_" + libraryVersion
			fmt.Fprintf(&b, "redis.register_function('%s', function(KEYS, ARGV)\nbegin(KEYS, ARGV)\n%s\nend)\n", sc.function, sc.body)
		}
		return b.String()
	}()
)

// script is one semaphore operation, runnable as a function or a script.
type script struct {
	name     string
	body     string
	eval     *redis.Script
	function string // set with libraryCode
}

func newScript(name, body string) *script {
	// Before Redis 5, a script that reads TIME and then writes must switch
	// to effects replication first.
	src := "if redis.replicate_commands then pcall(redis.replicate_commands) end\n" +
		luaLib + "\nbegin(KEYS, ARGV)\n" + body
	return &script{name: name, body: body, eval: redis.NewScript(src)}
}

// Statuses returned by acquire.lua.
const (
	acquireGranted  = 1
	acquireQueued   = 0
	acquireFull     = 2
	acquireTooHeavy = -1
)

// Statuses returned by release.lua.
const (
	releaseUnknown = 0
	releaseHeld    = 1
	releaseQueued  = 2
)
