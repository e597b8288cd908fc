package limiter

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestAppendKeyPartIsInjective(t *testing.T) {
	enc := func(parts ...string) string {
		var b []byte
		for _, p := range parts {
			b = AppendKeyPart(b, p)
		}
		return string(b)
	}
	long := strings.Repeat("x", 300)
	cases := [][2][]string{
		{{"ab", "c"}, {"a", "bc"}},
		{{"bob_path_/pay"}, {"bob", "path", "/pay"}},
		{{"user", "bob_path_/pay"}, {"user", "bob", "path", "/pay"}},
		{{long, "a"}, {long + "a"}},
		{{"", "a"}, {"a", ""}},
		{{"{x}"}, {"x"}},
	}
	for _, c := range cases {
		if a, b := enc(c[0]...), enc(c[1]...); a == b {
			t.Errorf("%q and %q encode alike: %q", c[0], c[1], a)
		}
	}
	if got := enc(long); len(got) != 302 || got[0] != 0xac || got[1] != 0x02 {
		t.Errorf("300-byte part: prefix % x, len %d; want ac 02, 302", got[:2], len(got))
	}
}

func TestParseNamesRoundTrip(t *testing.T) {
	for a := SlidingWindow; a <= SlidingLog; a++ {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a, got, err)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil {
		t.Error("ParseAlgorithm(leaky) succeeded")
	}
	for m := FailFallback; m <= FailDeny; m++ {
		got, err := ParseFailureMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseFailureMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseFailureMode("maybe"); err == nil {
		t.Error("ParseFailureMode(maybe) succeeded")
	}
}

func TestLimitValidate(t *testing.T) {
	ok := Limit{Requests: 1, Window: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid limit: %v", err)
	}
	for _, l := range []Limit{
		{Requests: 0, Window: time.Second},
		{Requests: 1, Window: 0},
		{Requests: 1, Window: -time.Second},
		{Requests: 1, Window: time.Millisecond + time.Microsecond},
		{Requests: 1, Window: time.Second, Algorithm: 9},
	} {
		if err := l.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: Validate() = %v, want ErrInvalid", l, err)
		}
	}
	if c := (Limit{Algorithm: TokenBucket, Requests: 10, Burst: 40}).Capacity(); c != 40 {
		t.Errorf("token bucket capacity = %d, want 40", c)
	}
	if c := (Limit{Algorithm: SlidingWindow, Requests: 10, Burst: 40}).Capacity(); c != 10 {
		t.Errorf("sliding window capacity = %d, want 10", c)
	}
}

// TestLimitExactRange: each algorithm's bound, and the error names what to
// lower (TestExactRangeBoundaries in pkg/redisbackend counts at the bounds).
func TestLimitExactRange(t *testing.T) {
	const perSecond = MaxExact / 1000
	for _, c := range []struct {
		l    Limit
		want string // "" when in range
	}{
		{Limit{Algorithm: SlidingWindow, Requests: MaxWindowRequests, Window: time.Hour}, ""},
		{Limit{Algorithm: FixedWindow, Requests: MaxWindowRequests + 1, Window: time.Millisecond}, "more than fixed_window counts exactly"},
		{Limit{Algorithm: TokenBucket, Requests: perSecond, Window: time.Second}, ""},
		{Limit{Algorithm: TokenBucket, Requests: perSecond + 1, Window: time.Second}, "lower the burst"},
		{Limit{Algorithm: TokenBucket, Requests: perSecond + 1, Burst: 5, Window: time.Second}, "lower the requests"},
		{Limit{Algorithm: TokenBucket, Requests: 5, Burst: perSecond + 1, Window: time.Second}, "token_bucket burst 9007199254741 × window 1000ms"},
		{Limit{Algorithm: SlidingLog, Requests: 10000, Window: time.Duration(MaxExact/10000) * time.Millisecond}, ""},
		{Limit{Algorithm: SlidingLog, Requests: 10000, Window: time.Duration(MaxExact/10000+1) * time.Millisecond}, "sliding_log requests 10000 × window"},
	} {
		err := c.l.ExactRange()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: ExactRange() = %v, want %q", c.l, err, c.want)
		}
	}
}

// TestMillisSaturates: a figure of the scripts beyond the largest Duration
// becomes the largest Duration, not a negative one.
func TestMillisSaturates(t *testing.T) {
	const maxMs = math.MaxInt64 / int64(time.Millisecond)
	for _, c := range []struct {
		ms   int64
		want time.Duration
	}{
		{0, 0},
		{1500, 1500 * time.Millisecond},
		{maxMs, time.Duration(maxMs) * time.Millisecond},
		{maxMs + 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := Millis(c.ms); got != c.want {
			t.Errorf("Millis(%d) = %v, want %v", c.ms, got, c.want)
		}
	}
}
