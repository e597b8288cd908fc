package redisbackend

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// countingScript lists the files of a counting script: the helpers, one file
// per algorithm, then the driver.
func countingScript(driver string) []string {
	return []string{"lib.lua", "sliding_window.lua", "fixed_window.lua", "token_bucket.lua", "sliding_log.lua", driver}
}

// scripts holds the Lua scripts of one Backend. They are immutable after
// newScripts and safe for concurrent use.
type scripts struct {
	check     *redis.Script
	refund    *redis.Script
	heartbeat *redis.Script
	// checkSHA and checkSrc are check's SHA1 and source, boxed once for
	// the command arguments built by runCheck.
	checkSHA, checkSrc any
}

func newScripts() (*scripts, error) {
	check, err := concatLua(countingScript("check.lua")...)
	if err != nil {
		return nil, err
	}
	refund, err := concatLua(countingScript("refund.lua")...)
	if err != nil {
		return nil, err
	}
	heartbeat, err := concatLua("heartbeat.lua")
	if err != nil {
		return nil, err
	}
	c := redis.NewScript(check)
	return &scripts{
		check:     c,
		refund:    redis.NewScript(refund),
		heartbeat: redis.NewScript(heartbeat),
		checkSHA:  c.Hash(),
		checkSrc:  check,
	}, nil
}

// concatLua joins the embedded files in order into one script.
func concatLua(names ...string) (string, error) {
	var b strings.Builder
	for _, n := range names {
		src, err := luaFiles.ReadFile("lua/" + n)
		if err != nil {
			return "", err
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String(), nil
}
