// Package gcpercent is the flag that sets the Go garbage collector's GOGC,
// with one rule and one default for every command of this module.
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
	"errors"
	"flag"
	"fmt"
	"strconv"
)

// Default is the GOGC a command runs with unless its flag or the GOGC
// variable says otherwise.
const Default = 400

// Flag is a GOGC flag, a flag.Value. It starts at Default and records
// whether it was set, on the command line or by fs.Set (envoy-rls's
// environment variables), which decides whether the GOGC variable applies.
type Flag struct {
	name    string
	percent int
	given   bool
}

// New registers a GOGC flag called name on fs.
func New(fs *flag.FlagSet, name, usage string) *Flag {
	f := &Flag{name: name, percent: Default}
	fs.Var(f, name, usage)
	return f
}

// String implements flag.Value.
func (f *Flag) String() string { return strconv.Itoa(f.percent) }

// Set implements flag.Value; Check refuses a value out of range.
func (f *Flag) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil {
		return errors.New("not an integer")
	}
	f.percent, f.given = int(n), true
	return nil
}

// Check refuses a percent out of range, naming the flag.
func (f *Flag) Check() error {
	if f.percent < 1 {
		return fmt.Errorf("--%s %d: must be 1 or more (GOGC=off, with GOMEMLIMIT, is for the GOGC variable)", f.name, f.percent)
	}
	return nil
}

// Apply sets GOGC to the flag's percent through set (debug.SetGCPercent),
// unless the GOGC variable is set and the flag was not: Go has applied GOGC
// at start, and it is left alone. An empty GOGC counts as unset (Go ran at
// its default of 100, not at what the variable says), and so does one Go
// cannot read (neither "off" nor a decimal integer: "400%"), which is named
// in from. It returns the GOGC in effect and where it came from, for the
// log.
func (f *Flag) Apply(lookupEnv func(string) (string, bool), set func(int) int) (gogc, from string) {
	from = "--" + f.name
	if env, ok := lookupEnv("GOGC"); ok && env != "" && !f.given {
		if goReads(env) {
			return env, "the GOGC variable"
		}
		from += fmt.Sprintf(" (GOGC=%q is no number, which Go ignores)", env)
	}
	set(f.percent)
	return strconv.Itoa(f.percent), from
}

// goReads reports whether the runtime takes GOGC=v as a setting: "off", or
// a decimal int32 (runtime.readGOGC).
func goReads(v string) bool {
	_, err := strconv.ParseInt(v, 10, 32)
	return v == "off" || err == nil
}
