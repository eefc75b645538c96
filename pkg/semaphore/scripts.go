package semaphore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Every script is lib.lua followed by its own body, so that the key layout,
// the clock, purge and grant are written once. See scripts/lib.lua for the
// KEYS and ARGV every script shares.
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

	scriptAcquire  = redis.NewScript(luaLib + luaAcquire)
	scriptRelease  = redis.NewScript(luaLib + luaRelease)
	scriptRefresh  = redis.NewScript(luaLib + luaRefresh)
	scriptSetLimit = redis.NewScript(luaLib + luaSetLimit)
	scriptStats    = redis.NewScript(luaLib + luaStats)
)

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
