package redisbackend

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// libraryFiles are the files that define the helpers and the algorithm
// modules, in order; a driver (check.lua, refund.lua) follows them.
var libraryFiles = []string{"lib.lua", "sliding_window.lua", "fixed_window.lua", "token_bucket.lua", "sliding_log.lua", "algorithms.lua"}

// countingScript lists the files of a counting script: the library files,
// then the driver.
func countingScript(driver string) []string {
	return append(libraryFiles[:len(libraryFiles):len(libraryFiles)], driver)
}

// scripts holds the Lua code of one Backend. It is immutable after
// newScripts and safe for concurrent use.
//
// The check driver runs in one of two forms. As a Redis Function (Redis ≥
// 7.0, FCALL) the library is loaded once per server and only the driver runs
// per call. As a script (EVALSHA) Redis runs the whole concatenation per call,
// redefining every helper first, which costs about a tenth more Redis CPU per
// check; it is the fallback for servers without FCALL.
type scripts struct {
	check     *redis.Script
	refund    *redis.Script
	heartbeat *redis.Script
	// checkSHA and checkSrc are check's SHA1 and source, boxed once for
	// the command arguments built by runCheck.
	checkSHA, checkSrc any
	// refundSrc is refund's source, for EVAL when Redis lacks the script.
	refundSrc string
	// library is the source of the Functions library (FUNCTION LOAD);
	// checkFn is the name of its check function, boxed once. Both names
	// carry a hash of the library, so that instances of different versions
	// can share a server during a rolling upgrade.
	library string
	checkFn any
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
	library, checkFn, err := functionLibrary()
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
		refundSrc: refund,
		library:   library,
		checkFn:   checkFn,
	}, nil
}

// functionLibrary returns the Functions library that registers check.lua as
// a function, and that function's name:
//
//	#!lua name=envoy_rls_<v>
//	<library files>
//	redis.register_function('envoy_rls_check_<v>', function(KEYS, ARGV)
//	<check.lua>
//	end)
//
// where <v> is the first 12 hex digits of the SHA-256 of everything after
// the first line. Naming the parameters KEYS and ARGV lets check.lua read as
// it does as a script.
func functionLibrary() (library, checkFn string, err error) {
	defs, err := concatLua(libraryFiles...)
	if err != nil {
		return "", "", err
	}
	driver, err := concatLua("check.lua")
	if err != nil {
		return "", "", err
	}
	const fnPlaceholder = "\x00fn\x00"
	body := defs + "redis.register_function('" + fnPlaceholder + "', function(KEYS, ARGV)\n" + driver + "end)\n"
	sum := sha256.Sum256([]byte(body))
	v := hex.EncodeToString(sum[:6])
	checkFn = "envoy_rls_check_" + v
	return "#!lua name=envoy_rls_" + v + "\n" + strings.Replace(body, fnPlaceholder, checkFn, 1), checkFn, nil
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
