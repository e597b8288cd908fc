package rls

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// referenceProblemBody is the problem+json body as encoding/json renders
// it: appendProblemBody must write the same bytes.
func referenceProblemBody(t testing.TB, name string, l limiter.Limit, retry int64) []byte {
	b, err := json.Marshal(problem{
		Type:       "about:blank",
		Title:      "Too Many Requests",
		Status:     429,
		Detail:     fmt.Sprintf("rate limit %q (%d per %v) exceeded; retry after %d s", name, l.Requests, l.Window, retry),
		Limit:      name,
		Requests:   l.Requests,
		Window:     l.Window.String(),
		RetryAfter: retry,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jsonStrings are strings that exercise every escape of encoding/json.
func jsonStrings(rng *rand.Rand) []string {
	out := []string{"", "per_ip", `a"b\c`, "<script>&amp;</script>", "\u2028\u2029", "\xff\xfe", "é日本\U0001F600",
		"\x00\x01\b\f\n\r\t\x1f\x7f", "a\xe2\x80", "\xed\xa0\x80"}
	for c := range 256 {
		out = append(out, string(rune(c)), string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	alphabet := []string{"a", "\"", "\\", "<", ">", "&", "\n", "\x00", "\x7f", "\xff", "é", "\u2028", "\u2029", "\U0001F600", "\xe2\x80", " "}
	for range 2000 {
		var b []byte
		for range rng.IntN(12) {
			b = append(b, alphabet[rng.IntN(len(alphabet))]...)
		}
		out = append(out, string(b))
	}
	return out
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range jsonStrings(rand.New(rand.NewPCG(1, 2))) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("appendJSONString(%q) = %s, encoding/json %s", s, got, want)
		}
		if got := appendJSONString(nil, []byte(s)); !bytes.Equal(got, want) {
			t.Errorf("appendJSONString([]byte(%q)) = %s, encoding/json %s", s, got, want)
		}
	}
}

func TestProblemBodyMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	windows := []time.Duration{time.Millisecond, 1500 * time.Millisecond, time.Second, time.Minute, 90 * time.Minute, 24 * time.Hour, 30 * 24 * time.Hour}
	for i, name := range jsonStrings(rng) {
		l := limiter.Limit{Requests: rng.Uint64N(1 << uint(rng.IntN(64))), Window: windows[i%len(windows)]}
		retry := rng.Int64N(1 << uint(rng.IntN(40)))
		if got, want := appendProblemBody(nil, name, l, retry), referenceProblemBody(t, name, l, retry); !bytes.Equal(got, want) {
			t.Fatalf("appendProblemBody(%q, %+v, %d) =\n %s\nencoding/json:\n %s", name, l, retry, got, want)
		}
	}
	// A long name does not fit the stack buffers.
	long := string(bytes.Repeat([]byte("<ab\"c>"), 300))
	l := limiter.Limit{Requests: 7, Window: time.Minute}
	if got, want := appendProblemBody(nil, long, l, 3), referenceProblemBody(t, long, l, 3); !bytes.Equal(got, want) {
		t.Fatalf("long name: %s\nwant %s", got, want)
	}
}

func FuzzProblemBody(f *testing.F) {
	f.Add("per_ip", uint64(120), int64(60_000), int64(42))
	f.Add("a\"<\u2028\xff", uint64(0), int64(1), int64(0))
	f.Fuzz(func(t *testing.T, name string, requests uint64, windowMs, retry int64) {
		l := limiter.Limit{Requests: requests, Window: time.Duration(windowMs) * time.Millisecond}
		if got, want := appendProblemBody(nil, name, l, retry), referenceProblemBody(t, name, l, retry); !bytes.Equal(got, want) {
			t.Fatalf("appendProblemBody(%q, %+v, %d) =\n %s\nencoding/json:\n %s", name, l, retry, got, want)
		}
	})
}
