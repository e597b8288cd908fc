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
// remaining from -1 - remaining and its retry from the integer only a
// denial carries, the no-consumption figures with alt; the group consumed
// unless a request but a shadow one was denied. A reply that is not a group
// of its requests exactly (too short, too long, or a retry where an
// admission has none, which shifts what follows), a denial without a retry
// of at least 1 ms, or a negative value elsewhere is refused rather than
// decoded (a denial must never come out as an admission).
func TestDecodeReply(t *testing.T) {
	const now = 1_767_225_600_137
	two := make([]limiter.Request, 2)
	res := make([]limiter.Result, 2)
	gotNow, committed, err := decodeReply(reply(now, 5, 100, -1-3, 50, 7), two, nil, res, nil)
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

	// The same denial of a shadow request leaves the group consumed.
	shadow := []limiter.Request{{}, {Shadow: true}}
	if _, committed, err := decodeReply(reply(now, 5, 100, -1-3, 50, 7), shadow, nil, res, nil); err != nil || !committed {
		t.Errorf("a shadow request's denial: committed %v, %v; want true, nil", committed, err)
	}

	// With alt, through idx: the results land at their requests' indexes.
	res = make([]limiter.Result, 3)
	alt := make([]figures, 2)
	if _, committed, err := decodeReply(reply(now, 0, 10, 1, 10, -1-9, 40, 15, 0, 20), make([]limiter.Request, 3), []int{2, 0}, res, alt); err != nil || committed {
		t.Fatalf("decodeReply with alt: committed %v, %v; want false, nil", committed, err)
	}
	if !res[2].Allowed || res[2].Remaining != 0 || res[2].RetryAfter != 0 || res[0].Allowed || res[0].Remaining != 9 ||
		res[0].ResetAfter != 40*time.Millisecond || res[0].RetryAfter != 15*time.Millisecond {
		t.Errorf("results by idx: %+v", res)
	}
	if alt[0] != (figures{remaining: 1, reset: 10 * time.Millisecond}) || alt[1] != (figures{remaining: 0, reset: 20 * time.Millisecond}) {
		t.Errorf("alt figures: %+v", alt)
	}

	for _, tc := range []struct {
		name, reply, err string
	}{
		{"an admission with a retry", reply(now, 5, 100, 3), "not a group"},
		{"a negative remaining taken for a denial's", reply(now, 4, 100, 7), "not a group"},
		{"a denial without a retry", reply(now, -1, 100), "not a group"},
		{"a denial with a retry of 0", reply(now, -1, 100, 0), "denial without a retry"},
		{"no request", reply(now), "not a group"},
		{"a negative reset", reply(now, 5, -100), "negative value"},
		{"a negative retry", reply(now, -1, 100, -7), "negative value"},
		{"a negative clock", reply(-now, 5, 100), "negative value"},
		{"a partial integer", reply(now, 5, 100)[:23], "not a group"},
	} {
		_, _, err := decodeReply(tc.reply, make([]limiter.Request, 1), nil, make([]limiter.Result, 1), nil)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.err)
		}
	}
}

// TestSplitReply: a coalesced call's reply is cut into its groups' parts by
// their requests' decisions (a denial carries one integer more), and a
// reply that ends within a group or holds more than its groups fails every
// part with an error saying so.
func TestSplitReply(t *testing.T) {
	const now = 1_767_225_600_137
	first, second := reply(now, 5, 100, -1-3, 50, 7), reply(now, -1, 9, 2)
	calls := []*slotCall{{}, {}}
	parts := []part{{call: calls[0], n: 2}, {call: calls[1], n: 1}}
	splitReply(first+second, nil, false, parts)
	if calls[0].err != nil || calls[1].err != nil || calls[0].reply != first || calls[1].reply != second {
		t.Fatalf("split: %q (%v), %q (%v); want %q, %q", calls[0].reply, calls[0].err, calls[1].reply, calls[1].err, first, second)
	}
	withAlt := reply(now, 5, 100, 6, 100, -1, 9, 2, 0, 9)
	splitReply(withAlt, nil, true, []part{{call: calls[0], n: 2}})
	if calls[0].err != nil || calls[0].reply != withAlt {
		t.Fatalf("split with alt: %q (%v), want %q", calls[0].reply, calls[0].err, withAlt)
	}
	for _, tc := range []struct {
		name, reply, err string
	}{
		{"a reply that ends within the second group", first + second[:16], "ends within group 2 of 2"},
		{"a reply with an integer after its groups", first + second + reply(0), "8 bytes after its 2 groups"},
	} {
		splitReply(tc.reply, nil, false, parts)
		for i, c := range calls {
			if c.err == nil || !strings.Contains(c.err.Error(), tc.err) || c.reply != "" {
				t.Errorf("%s: part %d: %q, %v; want no reply and an error with %q", tc.name, i+1, c.reply, c.err, tc.err)
			}
		}
	}
}

// FuzzDecodeReply: whatever bytes a reply holds, cutting it into two groups
// of n requests and decoding them neither panics nor reads past it, a reply
// that is cut holds its two parts exactly, and a part that decodes gives
// each request what a plain walk of its integers finds there (decision,
// reset, a denial's retry, with alt the two figures) and consumed exactly
// when no request but a shadow one was denied.
func FuzzDecodeReply(f *testing.F) {
	f.Add(reply(1, 5, 100, -1-3, 50, 7)+reply(2, 0, 9, 1, 9), uint8(1), false, uint8(0))
	f.Add(reply(1, 5, 100, -1-3, 50, 7)+reply(2, 0, 9, 1, 9), uint8(1), false, uint8(2)) // the denial a shadow request's
	f.Add(reply(1, 0, 10, 1, 10, -1-9, 40, 15, 0, 20)+reply(2, 4, 5, 4, 5), uint8(0), true, uint8(2))
	f.Add(reply(1, -1, 9, 2, -1, 9, 0)+reply(2, 5, 100, 3, 6, 7), uint8(1), false, uint8(1))
	f.Fuzz(func(t *testing.T, v string, n uint8, alt bool, shadow uint8) {
		per := int(n%4) + 1
		calls := []*slotCall{{}, {}}
		splitReply(v, nil, alt, []part{{call: calls[0], n: per}, {call: calls[1], n: per}})
		if calls[0].err != nil {
			if calls[1].err == nil || calls[0].reply != "" || calls[1].reply != "" {
				t.Fatalf("a split that failed left a part: %q (%v), %q (%v)", calls[0].reply, calls[0].err, calls[1].reply, calls[1].err)
			}
			return
		}
		if calls[0].reply+calls[1].reply != v {
			t.Fatalf("parts %q and %q are not the reply %q", calls[0].reply, calls[1].reply, v)
		}
		reqs := make([]limiter.Request, per)
		for j := range reqs {
			reqs[j].Shadow = shadow&(1<<j) != 0
		}
		for _, c := range calls {
			res := make([]limiter.Result, per)
			var figs []figures
			if alt {
				figs = make([]figures, per)
			}
			now, committed, err := decodeReply(c.reply, reqs, nil, res, figs)
			if err != nil {
				continue
			}
			x := func(off int) int64 { return int64(binary.LittleEndian.Uint64([]byte(c.reply[off : off+8]))) }
			if now != x(0) {
				t.Fatalf("clock %d, want %d", now, x(0))
			}
			off, consumed := 8, true
			for j := range per {
				d, reset := x(off), x(off+8)
				off += 16
				want := limiter.Result{Allowed: d >= 0, Remaining: uint64(d), ResetAfter: limiter.Millis(reset), Source: limiter.SourceStore}
				if d < 0 {
					want.Remaining = uint64(-1 - d)
					want.RetryAfter = limiter.Millis(x(off))
					off += 8
					consumed = consumed && reqs[j].Shadow
				}
				if res[j] != want {
					t.Fatalf("request %d of %q: %+v, want %+v", j, c.reply, res[j], want)
				}
				if alt {
					if wantFig := (figures{remaining: uint64(x(off)), reset: limiter.Millis(x(off + 8))}); figs[j] != wantFig {
						t.Fatalf("figures %d of %q: %+v, want %+v", j, c.reply, figs[j], wantFig)
					}
					off += 16
				}
			}
			if off != len(c.reply) || committed != consumed {
				t.Fatalf("%q: %d of %d bytes walked, committed %v, want %v", c.reply, off, len(c.reply), committed, consumed)
			}
		}
	})
}
