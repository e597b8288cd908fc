// Package gcpercent sets the Go garbage collector's GOGC from a command-line
// flag, by one rule for every command of this module.
//
// envoy-rls keeps a few MB live and allocates on every request, so at Go's
// default GOGC of 100 it collects dozens of times a second under load;
// Default is what it runs with instead (docs/performance.md, "The GC
// setting"). rls-bench's do-nothing server runs with the same setting, so
// that the ceiling it measures is not slowed by a collector envoy-rls does
// not have, and its load generator too, so that its own collections add
// less to the latency it reports.
package gcpercent

import (
	"fmt"
	"strconv"
)

// Default is the GOGC a command runs with unless its flag or the GOGC
// variable says otherwise.
const Default = 400

// Check refuses a percent out of range, naming the flag.
func Check(flag string, percent int) error {
	if percent < 1 {
		return fmt.Errorf("--%s %d: must be 1 or more (GOGC=off, with GOMEMLIMIT, is for the GOGC variable)", flag, percent)
	}
	return nil
}

// Apply sets GOGC to percent through set (debug.SetGCPercent), unless the
// GOGC variable is set and the flag was not given (given false): Go has
// applied GOGC at start, and it is left alone. An empty GOGC counts as
// unset (Go ran at its default of 100, not at what the variable says). It
// returns the GOGC in effect and where it came from, for the log.
func Apply(flag string, percent int, given bool, lookupEnv func(string) (string, bool), set func(int) int) (gogc, from string) {
	if env, ok := lookupEnv("GOGC"); ok && env != "" && !given {
		return env, "the GOGC variable"
	}
	set(percent)
	return strconv.Itoa(percent), "--" + flag
}
