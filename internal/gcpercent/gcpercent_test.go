package gcpercent

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// parse registers the flag as "gc" on a new FlagSet and parses args.
func parse(t *testing.T, args ...string) (*Flag, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := New(fs, "gc", "")
	return f, fs.Parse(args)
}

func TestApply(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		wantSet  int // 0: not set
		wantGOGC string
		wantFrom string
	}{
		{name: "default", wantSet: Default, wantGOGC: "400", wantFrom: "--gc"},
		{name: "flag", args: []string{"--gc", "250"}, wantSet: 250, wantGOGC: "250", wantFrom: "--gc"},
		{name: "flag at its default", args: []string{"--gc", "400"}, env: map[string]string{"GOGC": "150"}, wantSet: 400, wantGOGC: "400", wantFrom: "--gc"},
		{name: "GOGC without the flag", env: map[string]string{"GOGC": "150"}, wantGOGC: "150", wantFrom: "the GOGC variable"},
		{name: "empty GOGC", env: map[string]string{"GOGC": ""}, wantSet: Default, wantGOGC: "400", wantFrom: "--gc"},
		{name: "GOGC=off without the flag", env: map[string]string{"GOGC": "off"}, wantGOGC: "off", wantFrom: "the GOGC variable"},
		// Go runs at 100 with a GOGC it cannot read: the flag applies,
		// and the log says why the variable did not.
		{name: "GOGC no number", env: map[string]string{"GOGC": "400%"}, wantSet: Default, wantGOGC: "400", wantFrom: `--gc (GOGC="400%" is no number, which Go ignores)`},
		{name: "GOGC in hexadecimal", env: map[string]string{"GOGC": "0x10"}, wantSet: Default, wantGOGC: "400", wantFrom: `--gc (GOGC="0x10" is no number, which Go ignores)`},
		{name: "negative GOGC", env: map[string]string{"GOGC": "-1"}, wantGOGC: "-1", wantFrom: "the GOGC variable"},
		{name: "flag over GOGC", args: []string{"--gc", "300"}, env: map[string]string{"GOGC": "150"}, wantSet: 300, wantGOGC: "300", wantFrom: "--gc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parse(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			set := 0
			gogc, from := f.Apply(lookup, func(p int) int { set = p; return 100 })
			if set != tc.wantSet || gogc != tc.wantGOGC || from != tc.wantFrom {
				t.Errorf("set %d, GOGC %q from %q; want set %d, GOGC %q from %q", set, gogc, from, tc.wantSet, tc.wantGOGC, tc.wantFrom)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	for _, p := range []string{"1", "400", "10000", "0x10"} {
		f, err := parse(t, "--gc", p)
		if err != nil || f.Check() != nil {
			t.Errorf("--gc %s: %v, %v", p, err, f.Check())
		}
	}
	for _, p := range []string{"0", "-1"} {
		f, err := parse(t, "--gc", p)
		if err != nil {
			t.Fatalf("--gc %s: %v", p, err)
		}
		if err := f.Check(); err == nil || !strings.Contains(err.Error(), "--gc "+p+": must be 1 or more") {
			t.Errorf("--gc %s: Check = %v, want an error naming --gc", p, err)
		}
	}
	if _, err := parse(t, "--gc", "many"); err == nil {
		t.Error("--gc many: no error")
	}
}

// TestDefaultPrinted: --help shows the default, as an int flag's would.
func TestDefaultPrinted(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	New(fs, "gc", "the `percent`")
	fs.PrintDefaults()
	if !strings.Contains(out.String(), "-gc percent") || !strings.Contains(out.String(), "(default 400)") {
		t.Errorf("PrintDefaults:\n%s", out.String())
	}
}
