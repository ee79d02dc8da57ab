package redisstore

import (
	"crypto/sha1" //nolint:gosec // the digest Redis names scripts by, not a security measure
	"embed"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
)

// The scripts: one Lua file per algorithm (its evaluation, its commit, its give-back), joined
// with the helpers into the two scripts the store runs: take (a group of charges, all or
// nothing, at one instant) and give (give-backs). A group mixes algorithms and must be decided
// in one atomic step, so the algorithms' files are parts of one script rather than scripts of
// their own. rueidis runs each by its SHA-1 digest (EVALSHA) and sends the source again
// (EVAL, which caches it) only when the server answers NOSCRIPT: after a restart, a failover or
// SCRIPT FLUSH.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// parts are the files every script starts with, in order.
var parts = []string{"ns.lua", "gcra.lua", "window.lua", "sliding.lua", "slots.lua"}

func script(main string) string {
	var b strings.Builder
	for _, f := range append(parts, main) {
		b.WriteString(mustRead(f))
		b.WriteByte('\n')
	}
	return b.String()
}

var (
	takeSource  = script("take.lua")
	takeSHA     = fmt.Sprintf("%x", sha1.Sum([]byte(takeSource)))
	takeScript  = rueidis.NewLuaScript(takeSource)
	giveScript  = rueidis.NewLuaScript(script("give.lua"))
	adminScript = rueidis.NewLuaScript(mustRead("exempt.lua"))
)

// rueidisCompleted is a built command.
type rueidisCompleted = rueidis.Completed

func mustRead(f string) string {
	src, err := luaFiles.ReadFile("lua/" + f)
	if err != nil {
		panic("redisstore: embedded " + f + ": " + err.Error())
	}
	return string(src)
}

// The algorithms' numbers in the scripts' arguments.
const (
	algToken       = "1"
	algLeaky       = "2"
	algFixed       = "3"
	algSliding     = "4"
	algConcurrency = "5"
	algQuota       = "6"
)
