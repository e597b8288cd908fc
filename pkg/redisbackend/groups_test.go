package redisbackend

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestGroupsOfOneCall: one call of check.lua carrying four groups (the
// Checks of four callers, as the coalescer sends them) on two counters
// decides them in order, each seeing what the groups before it committed,
// a vetoed group consuming nothing; and it reads the counters with one MGET
// and writes each touched counter once, with its expiry.
//
//	group 1: A          admitted
//	group 2: A          admitted, A is now full
//	group 3: A, B       A denied: the group is vetoed and B not consumed
//	group 4: B, B       admitted, B holds 2
func TestGroupsOfOneCall(t *testing.T) {
	r := testenv.RedisServer(t)
	t0 := time.Now()
	b := newSingle(t, r, DefaultKeyPrefix, func() time.Time { return t0 })
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := limiter.Limit{Algorithm: alg, Requests: 2, Window: time.Hour}
			a := limiter.Request{Key: key(t.Name(), "A"), Limit: lim, Hits: 1}
			bb := limiter.Request{Key: key(t.Name(), "B"), Limit: lim, Hits: 1}
			groups := [][]limiter.Request{{a}, {a}, {a, bb}, {bb, bb}}
			keys, argv := encodeGroups(b, groups...)
			v, calls := runCounted(t, r, b, keys, argv)

			want := []struct {
				committed bool
				allowed   []bool
				remaining []uint64
			}{
				{true, []bool{true}, []uint64{1}},
				{true, []bool{true}, []uint64{0}},
				{false, []bool{false, true}, []uint64{0, 2}}, // vetoed: figures on the stored state
				{true, []bool{true, true}, []uint64{1, 0}},
			}
			for i, gr := range decodeGroups(t, v, groups) {
				if gr.now != t0.UnixMilli() {
					t.Errorf("group %d decided at %d, want the injected %d", i+1, gr.now, t0.UnixMilli())
				}
				if gr.committed != want[i].committed {
					t.Errorf("group %d: committed %v, want %v", i+1, gr.committed, want[i].committed)
				}
				for j, x := range gr.res {
					if x.Allowed != want[i].allowed[j] || x.Remaining != want[i].remaining[j] {
						t.Errorf("group %d request %d: %+v, want allowed %v remaining %d", i+1, j+1, x, want[i].allowed[j], want[i].remaining[j])
					}
				}
			}

			if n := calls["mget"]; n != 1 {
				t.Errorf("%d MGETs in one call, want 1", n)
			}
			if n := calls["set"] + calls["setrange"]; n != 2 {
				t.Errorf("%d writes (SET, SETRANGE) in one call, want 2 (one per counter)", n)
			}
			for _, k := range []string{keys[0], keys[2]} { // A, B
				if ttl, err := r.Client().PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
					t.Errorf("counter %s: PTTL %v, %v; want an expiry", k, ttl, err)
				}
			}
			if got := used(t, b, a); got != 2 {
				t.Errorf("A holds %d hits, want 2", got)
			}
			if got := used(t, b, bb); got != 2 {
				t.Errorf("B holds %d hits, want 2 (the vetoed group consumed nothing)", got)
			}
		})
	}
}

// TestFailedCallLeavesNoScratch: a call that fails half-way (a malformed
// spec in its second group) leaves check.lua's scratch, which outlives a
// call as a Function, in a state that misleads no later call: the next
// call's keys, one of them the failed call's, map to their own counters,
// and the failed call wrote nothing.
func TestFailedCallLeavesNoScratch(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	lim := limiter.Limit{Requests: 10, Window: time.Hour}
	a := limiter.Request{Key: key(t.Name(), "A"), Limit: lim, Hits: 3}
	c := limiter.Request{Key: key(t.Name(), "C"), Limit: lim, Hits: 1}
	// A sliding log takes the next call to the general path, whose key
	// table the failed call filled; without it the call takes the lone path.
	log := limiter.Request{Key: key(t.Name(), "L"), Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10, Window: time.Hour}, Hits: 1}

	keys, argv := encodeGroups(b, []limiter.Request{a}, []limiter.Request{a})
	argv[len(argv)-1] = "1;9 1 1 1 1 0" // the second group: its spec of algorithm 9, malformed
	mustFail(t, b, keys, argv, "malformed request spec")

	res := make([]limiter.Result, 3)
	if err := b.Check(ctx, []limiter.Request{c, a, log}, res); err != nil {
		t.Fatalf("Check after the failed call: %v", err)
	}
	if res[0].Remaining != 9 || res[1].Remaining != 7 {
		t.Errorf("C remaining %d, A remaining %d; want 9 and 7 (own counters, nothing of the failed call)", res[0].Remaining, res[1].Remaining)
	}
}

// TestKeyPositionsAcrossCalls: check.lua's string counters' path knows a
// counter by the position of its first request in KEYS, found by scanning
// KEYS in a call of up to eight keys and above that through a table that
// outlives the call (as a Function) and is emptied at the start of the next
// call. Calls of ten and eleven keys in changing orders, a key repeated
// within a call, each count on their own counters.
func TestKeyPositionsAcrossCalls(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := limiter.Limit{Algorithm: alg, Requests: 10, Window: time.Hour}
			reqs := make([]limiter.Request, 10)
			for i := range reqs {
				reqs[i] = limiter.Request{Key: key(t.Name(), strconv.Itoa(i)), Limit: lim, Hits: 1}
			}
			// 1: every key once, in order. 2: reversed, the first key again at
			// the end (its second request sees the first). 3: rotated by
			// three, which puts the first key at position 8. 4: as 3, but the
			// first key at position 2 too (had the table kept call 3's
			// entries, it would say 8).
			reversed := slices.Clone(reqs)
			slices.Reverse(reversed)
			reversed = append(reversed, reqs[0])
			rotated := append(slices.Clone(reqs[3:]), reqs[:3]...)
			twice := slices.Clone(rotated)
			twice[1] = reqs[0]
			want := make(map[string]int64)
			for n, call := range [][]limiter.Request{reqs, reversed, rotated, twice} {
				res := make([]limiter.Result, len(call))
				if err := b.Check(ctx, call, res); err != nil {
					t.Fatalf("call %d: %v", n+1, err)
				}
				for i, x := range res {
					if !x.Allowed {
						t.Fatalf("call %d request %d denied: %+v", n+1, i+1, x)
					}
					want[call[i].Key]++
				}
			}
			for i, req := range reqs {
				if got := used(t, b, req); got != want[req.Key] {
					t.Errorf("key %d holds %d hits, want %d", i, got, want[req.Key])
				}
			}
		})
	}
}

// TestLastGroupWritesOnce: a counter that earlier groups of a call and its
// last group consume is written once, with the last group's state.
//
//	group 1: A      group 2: A, B      group 3: A
func TestLastGroupWritesOnce(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	lim := limiter.Limit{Requests: 5, Window: time.Hour}
	a := limiter.Request{Key: key(t.Name(), "A"), Limit: lim, Hits: 1}
	bb := limiter.Request{Key: key(t.Name(), "B"), Limit: lim, Hits: 1}
	keys, argv := encodeGroups(b, []limiter.Request{a}, []limiter.Request{a, bb}, []limiter.Request{a})
	if _, calls := runCounted(t, r, b, keys, argv); calls["set"]+calls["setrange"] != 2 {
		t.Errorf("%d writes (SET, SETRANGE) in one call, want 2 (one per counter)", calls["set"]+calls["setrange"])
	}
	if got := used(t, b, a); got != 3 {
		t.Errorf("A holds %d hits, want 3", got)
	}
	if got := used(t, b, bb); got != 1 {
		t.Errorf("B holds %d hits, want 1", got)
	}
}

// TestFailedCallLeavesNoTags: check.lua's string counters' path tags a
// counter's tentative state with its group's number, numbered across calls.
// A call that gives up after its first group (A twice, committed in the
// call's scratch; then a group without keys, so the call fails) must not leave
// a tag that a later call's group reads as its own: there, B's second
// request, after a first that consumed nothing, decides on B's stored state,
// not on the table the failed call left at the same position (A as stored,
// 5 hits).
func TestFailedCallLeavesNoTags(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	lim := limiter.Limit{Requests: 10, Window: time.Hour}
	a := limiter.Request{Key: key(t.Name(), "A"), Limit: lim, Hits: 1}
	peek := limiter.Request{Key: key(t.Name(), "B"), Limit: lim, Hits: 0}
	bb := limiter.Request{Key: key(t.Name(), "B"), Limit: lim, Hits: 1}

	five := a
	five.Hits = 5
	if err := b.Check(ctx, []limiter.Request{five}, make([]limiter.Result, 1)); err != nil {
		t.Fatalf("Check of A: %v", err)
	}
	// A second group of one request, for which no key is left: the string
	// counters' path gives up at it, after committing the first group in its
	// scratch, and the general path fails the call.
	keys, argv := encodeGroups(b, []limiter.Request{a, a})
	_, second := encodeGroups(b, []limiter.Request{a})
	mustFail(t, b, keys, append(argv, second...), "more requests than keys are left")

	res := make([]limiter.Result, 2)
	if err := b.Check(ctx, []limiter.Request{peek, bb}, res); err != nil {
		t.Fatalf("Check after the failed call: %v", err)
	}
	if res[0].Remaining != 10 || res[1].Remaining != 9 {
		t.Errorf("B remaining %d, then %d; want 10 and 9 (B's own counter)", res[0].Remaining, res[1].Remaining)
	}
	if got := used(t, b, a); got != 5 {
		t.Errorf("A holds %d hits, want 5 (the failed call wrote nothing)", got)
	}
}

// encodeGroups returns the KEYS and the ARGV (without ARGV[1], the flags)
// of one call of check.lua carrying groups, each the Check of its requests,
// as the coalescer builds them.
func encodeGroups(b *Backend, groups ...[]limiter.Request) (keys, argv []string) {
	for _, reqs := range groups {
		var g group
		g.encode(b, reqs, nil)
		keys = append(keys, g.keys...)
		argv = append(argv, g.argv...)
	}
	return keys, argv
}

// groupReply is one group's part of check.lua's reply, decoded.
type groupReply struct {
	now       int64
	committed bool
	res       []limiter.Result
}

// decodeGroups splits v, the reply of one call of check.lua carrying groups
// (without the Cluster's figures), into the groups' parts and decodes each;
// a reply of another length fails the test.
func decodeGroups(t testing.TB, v string, groups [][]limiter.Request) []groupReply {
	t.Helper()
	out := make([]groupReply, len(groups))
	for i, reqs := range groups {
		k, ok := groupReplyLen(v, len(reqs), false)
		if !ok {
			t.Fatalf("reply too short at group %d", i+1)
		}
		out[i].res = make([]limiter.Result, len(reqs))
		var err error
		out[i].now, out[i].committed, err = decodeReply(v[:k], reqs, nil, out[i].res, nil)
		if err != nil {
			t.Fatalf("group %d: %v", i+1, err)
		}
		v = v[k:]
	}
	if len(v) != 0 {
		t.Errorf("%d bytes of reply left over", len(v))
	}
	return out
}

// runCounted sends one call of check.lua with keys and argv, which must
// succeed, and returns its reply and the commands Redis ran for it, by name
// (INFO commandstats before and after).
func runCounted(t *testing.T, r *testenv.Redis, b *Backend, keys, argv []string) (string, map[string]int64) {
	t.Helper()
	before := r.CommandCalls(t)
	v, err := b.runCheck(context.Background(), &batch{}, keys, argv, b.flags[0]).Result()
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	calls := r.CommandCalls(t)
	for name := range calls {
		calls[name] -= before[name]
	}
	return v, calls
}

// mustFail sends one call of check.lua with keys and argv, which must fail
// with the script's error naming want.
func mustFail(t *testing.T, b *Backend, keys, argv []string, want string) {
	t.Helper()
	if err := b.runCheck(context.Background(), &batch{}, keys, argv, b.flags[0]).Err(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("malformed call: %v, want the script's %s error", err, want)
	}
}

// TestMalformedGroups: a group's text that does not parse fails the call
// with an error naming what is malformed, whichever of check.lua's paths
// the call would take, and the group's counter is not written.
func TestMalformedGroups(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	req := limiter.Request{Key: key(t.Name()), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}
	keys, argv := encodeGroups(b, []limiter.Request{req})
	spec := string(appendSpec(nil, &req))
	for text, want := range map[string]string{
		"x":                      "malformed group header",
		"1 " + spec:              "malformed group header", // no ';' before the spec
		"1x;" + spec:             "malformed group header",
		"2;" + spec:              "malformed group header", // a count of 2, one spec
		"1;" + spec + ";" + spec: "malformed group header", // a count of 1, two specs
		"1;":                     "malformed request spec",
		"1;9 1 1 1 1 0":          "malformed request spec", // algorithm 9
		"1;" + spec + " 1":       "malformed request spec",
	} {
		t.Run(text, func(t *testing.T) {
			mustFail(t, b, keys, []string{text}, want)
			// The same text again: a malformed group is not cached.
			mustFail(t, b, keys, []string{text}, want)
			if n, err := r.Client().Exists(context.Background(), keys[0]).Result(); err != nil || n != 0 {
				t.Errorf("EXISTS %v, %v; want the counter unwritten", n, err)
			}
		})
	}
	// And the well-formed text of the same group is served.
	if _, calls := runCounted(t, r, b, keys, argv); calls["set"] != 1 {
		t.Errorf("the well-formed group: %d SETs, want 1", calls["set"])
	}
}

// TestSlidingLogCallReadsOnce: a call with a sliding log goes to the general
// path before any other path reads a counter, so its counters are read with
// one MGET (the string counters' path once read them all and gave up at the
// log's group), whether the log's group comes first or after a window's.
func TestSlidingLogCallReadsOnce(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	win := limiter.Request{Key: key(t.Name(), "window"), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}
	log := limiter.Request{Key: key(t.Name(), "log"), Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10, Window: time.Minute}, Hits: 1}
	for name, groups := range map[string][][]limiter.Request{
		"a log alone":          {{log}},
		"a log and a window":   {{log, win}},
		"a window, then a log": {{win}, {log}},
		"a log, then a window": {{log}, {win}},
	} {
		t.Run(name, func(t *testing.T) {
			keys, argv := encodeGroups(b, groups...)
			if _, calls := runCounted(t, r, b, keys, argv); calls["mget"] != 1 {
				t.Errorf("%d MGETs, want 1", calls["mget"])
			}
		})
	}
}
