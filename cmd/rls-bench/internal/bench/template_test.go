package bench

import (
	"fmt"
	"strings"
	"testing"
)

func TestTemplateExpand(t *testing.T) {
	tests := []struct {
		src    string
		varies bool
		// want builds the expected entries for index i from the template's
		// meaning, written independently of the parser.
		want func(i int64) [][2]string
	}{
		{"remote_address=10.0.0.1", false, func(int64) [][2]string {
			return [][2]string{{"remote_address", "10.0.0.1"}}
		}},
		{"remote_address=10.0.{i}", true, func(i int64) [][2]string {
			return [][2]string{{"remote_address", fmt.Sprintf("10.0.%d", i)}}
		}},
		{"tenant=t{i%100},user=u{i}", true, func(i int64) [][2]string {
			return [][2]string{{"tenant", fmt.Sprintf("t%d", i%100)}, {"user", fmt.Sprintf("u%d", i)}}
		}},
		{"k={i}{i%7}-{i%1}x", true, func(i int64) [][2]string {
			return [][2]string{{"k", fmt.Sprintf("%d%d-%dx", i, i%7, 0)}}
		}},
		{"hot=", false, func(int64) [][2]string { return [][2]string{{"hot", ""}} }},
		{"a=x=y", false, func(int64) [][2]string { return [][2]string{{"a", "x=y"}} }},
	}
	for _, tc := range tests {
		tmpl, err := ParseTemplate(tc.src)
		if err != nil {
			t.Fatalf("ParseTemplate(%q): %v", tc.src, err)
		}
		if tmpl.Varies() != tc.varies {
			t.Errorf("%q: Varies() = %v, want %v", tc.src, tmpl.Varies(), tc.varies)
		}
		if tmpl.String() != tc.src {
			t.Errorf("String() = %q, want %q", tmpl.String(), tc.src)
		}
		for _, i := range []int64{0, 1, 7, 99, 100, 12345, 1<<40 + 3} {
			got := tmpl.Expand(i)
			want := tc.want(i)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%q.Expand(%d) = %v, want %v", tc.src, i, got, want)
			}
			if tmpl.Len() != len(want) {
				t.Errorf("%q.Len() = %d, want %d", tc.src, tmpl.Len(), len(want))
			}
		}
	}
}

func TestParseTemplateErrors(t *testing.T) {
	tests := []struct{ src, wantErr string }{
		{"", "empty"},
		{"novalue", "want key=value"},
		{"=v", "empty key"},
		{"a=1,,b=2", "want key=value"},
		{"k{i}=v", "values only"},
		{"k=v{i", "'{' without '}'"},
		{"k=v}", "'}' without '{'"},
		{"k={j}", "unknown placeholder {j}"},
		{"k={i%0}", "positive integer"},
		{"k={i%-3}", "positive integer"},
		{"k={i%x}", "positive integer"},
	}
	for _, tc := range tests {
		_, err := ParseTemplate(tc.src)
		if err == nil {
			t.Errorf("ParseTemplate(%q) = nil error, want one containing %q", tc.src, tc.wantErr)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ParseTemplate(%q) = %v, want an error containing %q", tc.src, err, tc.wantErr)
		}
	}
}
