package gcpercent

import (
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	cases := []struct {
		name     string
		percent  int
		given    bool
		env      map[string]string
		wantSet  int // 0: not set
		wantGOGC string
		wantFrom string
	}{
		{name: "default", percent: Default, wantSet: Default, wantGOGC: "400", wantFrom: "--gc"},
		{name: "flag", percent: 250, given: true, wantSet: 250, wantGOGC: "250", wantFrom: "--gc"},
		{name: "GOGC without the flag", percent: Default, env: map[string]string{"GOGC": "150"}, wantGOGC: "150", wantFrom: "the GOGC variable"},
		{name: "empty GOGC", percent: Default, env: map[string]string{"GOGC": ""}, wantSet: Default, wantGOGC: "400", wantFrom: "--gc"},
		{name: "GOGC=off without the flag", percent: Default, env: map[string]string{"GOGC": "off"}, wantGOGC: "off", wantFrom: "the GOGC variable"},
		{name: "flag over GOGC", percent: 300, given: true, env: map[string]string{"GOGC": "150"}, wantSet: 300, wantGOGC: "300", wantFrom: "--gc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			set := 0
			gogc, from := Apply("gc", tc.percent, tc.given, lookup, func(p int) int { set = p; return 100 })
			if set != tc.wantSet || gogc != tc.wantGOGC || from != tc.wantFrom {
				t.Errorf("set %d, GOGC %q from %q; want set %d, GOGC %q from %q", set, gogc, from, tc.wantSet, tc.wantGOGC, tc.wantFrom)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	for _, p := range []int{1, Default, 10000} {
		if err := Check("gc", p); err != nil {
			t.Errorf("Check(%d): %v", p, err)
		}
	}
	for _, p := range []int{0, -1} {
		err := Check("gc", p)
		if err == nil || !strings.Contains(err.Error(), "--gc ") {
			t.Errorf("Check(%d) = %v, want an error naming --gc", p, err)
		}
	}
}
