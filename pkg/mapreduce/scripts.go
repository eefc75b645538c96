package mapreduce

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Every change to a run is one script; see each file's header for its KEYS,
// ARGV and reply. All keys of a job share the hash tag {<job>}.
var (
	//go:embed scripts/start.lua
	luaStart string
	//go:embed scripts/record.lua
	luaRecord string
	//go:embed scripts/splitdone.lua
	luaSplitDone string
	//go:embed scripts/finish.lua
	luaFinish string
	//go:embed scripts/retry.lua
	luaRetry string
	//go:embed scripts/feed.lua
	luaFeed string
	//go:embed scripts/unlist.lua
	luaUnlist string
	//go:embed scripts/lasterror.lua
	luaLastError string

	scriptStart     = redis.NewScript(luaStart)
	scriptRecord    = redis.NewScript(luaRecord)
	scriptSplitDone = redis.NewScript(luaSplitDone)
	scriptFinish    = redis.NewScript(luaFinish)
	scriptRetry     = redis.NewScript(luaRetry)
	scriptFeed      = redis.NewScript(luaFeed)
	scriptUnlist    = redis.NewScript(luaUnlist)
	scriptLastError = redis.NewScript(luaLastError)
)
