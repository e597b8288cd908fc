package flagvalue_test

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/envoy-rls/envoy-rls/internal/flagvalue"
)

func TestList(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--x", "a"}, []string{"a"}},
		{[]string{"--x", " a , b,,c "}, []string{"a", "b", "c"}},
		{[]string{"--x", "a,b", "--x", "c"}, []string{"a", "b", "c"}},
	} {
		var l flagvalue.List
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Var(&l, "x", "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(l, tc.want) {
			t.Errorf("%q: %q, want %q", tc.args, l, tc.want)
		}
		if got, want := l.String(), fs.Lookup("x").Value.String(); got != want {
			t.Errorf("%q: String %q, the flag's %q", tc.args, got, want)
		}
	}
}

// TestListRefusesNoValue: a value with no item is an error, so that an
// empty --grpc.tls.client-san cannot leave mutual TLS open to any of the
// CA's certificates (a review's finding).
func TestListRefusesNoValue(t *testing.T) {
	for _, v := range []string{"", " ", " , ,"} {
		var l flagvalue.List
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Var(&l, "x", "")
		if err := fs.Parse([]string{"--x", "a", "--x", v}); err == nil {
			t.Errorf("--x %q accepted: %q", v, l)
		}
	}
}
