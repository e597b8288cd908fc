package redisbackend

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// reply packs integers as check.lua's reply does: little-endian 64-bit.
func reply(xs ...int64) string {
	b := make([]byte, 0, 8*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return string(b)
}

// TestDecodeReply: a group's reply decodes into its results, a denial's
// remaining from -1 - remaining, the no-consumption figures with alt; a
// reply whose decision and retry disagree, or with a negative value
// elsewhere, is refused rather than decoded (a denial must never come out
// as an admission).
func TestDecodeReply(t *testing.T) {
	const now = 1_767_225_600_137
	res := make([]limiter.Result, 2)
	gotNow, committed, err := decodeReply(reply(now, 0, 5, 100, 0, -1-3, 50, 7), nil, res, nil)
	if err != nil || gotNow != now || committed {
		t.Fatalf("decodeReply: now %d, committed %v, %v; want %d, false, nil", gotNow, committed, err, int64(now))
	}
	want := []limiter.Result{
		{Allowed: true, Remaining: 5, ResetAfter: 100 * time.Millisecond, Source: limiter.SourceStore},
		{Allowed: false, Remaining: 3, ResetAfter: 50 * time.Millisecond, RetryAfter: 7 * time.Millisecond, Source: limiter.SourceStore},
	}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, res[i], want[i])
		}
	}

	// With alt, through idx: the results land at their requests' indexes.
	res = make([]limiter.Result, 3)
	alt := make([]figures, 2)
	if _, committed, err := decodeReply(reply(now, 1, 0, 10, 0, 1, 10, -1-9, 40, 15, 0, 20), []int{2, 0}, res, alt); err != nil || !committed {
		t.Fatalf("decodeReply with alt: committed %v, %v", committed, err)
	}
	if !res[2].Allowed || res[2].Remaining != 0 || res[0].Allowed || res[0].Remaining != 9 ||
		res[0].ResetAfter != 40*time.Millisecond || res[0].RetryAfter != 15*time.Millisecond {
		t.Errorf("results by idx: %+v", res)
	}
	if alt[0] != (figures{remaining: 1, reset: 10 * time.Millisecond}) || alt[1] != (figures{remaining: 0, reset: 20 * time.Millisecond}) {
		t.Errorf("alt figures: %+v", alt)
	}

	for _, tc := range []struct {
		name, reply, err string
	}{
		{"an admission with a retry", reply(now, 1, 5, 100, 3), "disagrees"},
		{"a denial without a retry", reply(now, 0, -1, 100, 0), "disagrees"},
		{"a negative remaining taken for a denial's", reply(now, 0, 4, 100, 7), "disagrees"},
		{"a negative reset", reply(now, 1, 5, -100, 0), "negative value"},
		{"a negative clock", reply(-now, 1, 5, 100, 0), "negative value"},
	} {
		_, _, err := decodeReply(tc.reply, nil, make([]limiter.Result, 1), nil)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.err)
		}
	}
}
