package rls

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// TestGoldenResponses drives fixed scenarios through the gRPC server at
// fixed instants and compares FormatResponse's rendering of every response
// with testdata/<name>.golden (go test -update rewrites them).
func TestGoldenResponses(t *testing.T) {
	for _, c := range []struct {
		name  string
		mode  HeaderMode
		at    time.Duration
		descs []*commonv3.RateLimitDescriptor
		times int
	}{
		{"ietf_over_limit", HeadersIETF, 2500 * time.Millisecond, []*commonv3.RateLimitDescriptor{desc("user", "u"), desc("slow", "s"), desc("nomatch", "x")}, 2},
		{"draft03_several_limits", HeadersDraft03, 1200 * time.Millisecond, []*commonv3.RateLimitDescriptor{desc("multi", "m"), desc("ninety", "n"), desc("bucket", "b")}, 3},
		{"none_shadow", HeadersNone, 0, []*commonv3.RateLimitDescriptor{desc("shadowed", "s"), desc("free", "f")}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, testFiles, Options{Headers: c.mode})
			e.clock.Set(t0.Add(c.at))
			var out bytes.Buffer
			for i := range c.times {
				if i > 0 {
					out.WriteString("\n")
				}
				if err := FormatResponse(&out, e.must(request("test", c.descs...))); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("%s differs:\n--- got\n%s--- want\n%s", path, out.Bytes(), want)
			}
		})
	}
}

// TestFormatValueNumbers: metadata numbers print in digits, as the table
// above them does: 4999999, not 4.999999e+06 (a review's finding).
func TestFormatValueNumbers(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 12: "12", 4_999_999: "4999999", 9_007_199_254_740_991: "9007199254740991", 1.5: "1.5"} {
		if got := formatValue(structpb.NewNumberValue(v)); got != want {
			t.Errorf("formatValue(%v) = %q, want %q", v, got, want)
		}
	}
}
