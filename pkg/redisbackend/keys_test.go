package redisbackend

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

func baseKey(prefix string, r limiter.Request) string {
	return string(appendBaseKey(nil, prefix, &r))
}

// TestKeysDistinct: the collision cases of envoyproxy/ratelimit (which joins
// entries with "_") and values holding the characters that mean something in
// a Redis key ({, }, :, _) give distinct keys; the window and the algorithm
// are part of the identity, the limit and the burst are not.
func TestKeysDistinct(t *testing.T) {
	lim := limiter.Limit{Requests: 10, Window: time.Minute}
	keys := map[string][]string{}
	add := func(name string, r limiter.Request) {
		k := baseKey(DefaultKeyPrefix, r)
		keys[k] = append(keys[k], name)
	}
	for _, c := range []struct {
		name  string
		parts []string
	}{
		{"joined value", []string{"edge", "rule", "user", "bob_path_/pay"}},
		{"two entries", []string{"edge", "rule", "user", "bob", "path", "/pay"}},
		{"key with underscore", []string{"edge", "rule", "user_bob", "path_/pay"}},
		{"brace value", []string{"edge", "rule", "user", "{bob}"}},
		{"brace split", []string{"edge", "rule", "user", "{bob", "}", ""}},
		{"colon value", []string{"edge", "rule", "user", "bob:1"}},
		{"colon split", []string{"edge", "rule", "user", "bob", "1", ""}},
		{"domain shift", []string{"edgerule", "", "user", "bob"}},
		{"empty value", []string{"edge", "rule", "user", ""}},
	} {
		add(c.name, limiter.Request{Key: key(c.parts...), Limit: lim})
	}
	k := key("edge", "rule", "user", "bob")
	add("sliding 1m", limiter.Request{Key: k, Limit: lim})
	add("sliding 2m", limiter.Request{Key: k, Limit: limiter.Limit{Requests: 10, Window: 2 * time.Minute}})
	add("fixed 1m", limiter.Request{Key: k, Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Window: time.Minute}})
	add("token 1m", limiter.Request{Key: k, Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Window: time.Minute}})
	add("log 1m", limiter.Request{Key: k, Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10, Window: time.Minute}})
	for k, names := range keys {
		if len(names) > 1 {
			t.Errorf("key %s shared by %v", k, names)
		}
	}

	same := []limiter.Request{
		{Key: k, Limit: lim},
		{Key: k, Limit: limiter.Limit{Requests: 99, Window: time.Minute, Burst: 7}, Hits: 3, Shadow: true},
	}
	if a, b := baseKey("rls:", same[0]), baseKey("rls:", same[1]); a != b {
		t.Errorf("the limit and burst must not change the counter: %s vs %s", a, b)
	}
	if got := baseKey("x:", same[0]); !regexp.MustCompile(fmt.Sprintf(`^x:\{[A-Za-z0-9_-]{%d}\}$`, idLen)).MatchString(got) {
		t.Errorf("base key %q does not match the documented format", got)
	}
}

// TestSlotMatchesClusterKeyslot compares slot with CLUSTER KEYSLOT.
func TestSlotMatchesClusterKeyslot(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"))
	ctx := context.Background()
	c := r.Client()
	cases := []string{"", "a", "foo", "123456789", "{}", "{a}", "{a}{b}", "foo{}{bar}", "foo{{bar}}zap", "{user1000}.following",
		"rls:{AAAAAAAAAAAAAAAAAAAAAA}:17", "\x00\xff{\x80}"}
	for i := 0; i < 200; i++ {
		cases = append(cases, baseKey("rls:", limiter.Request{Key: key("d", fmt.Sprint(i)), Limit: limiter.Limit{Requests: 1, Window: time.Second}}))
	}
	for i := range 256 { // every entry of the CRC table, as a first and a second byte
		cases = append(cases, string([]byte{byte(i)}), string([]byte{'x', byte(i)}))
	}
	for _, k := range cases {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := slot(k); int64(got) != want {
			t.Errorf("slot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}
}

// TestScanShowsOnlyDocumentedKeys sends traffic with hostile values through
// every algorithm and a heartbeat, then SCANs Redis: every key matches the
// documented pattern and none contains a descriptor value.
func TestScanShowsOnlyDocumentedKeys(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	values := []string{"bob_path_/pay", "{evil}", "ta}g{", "a:b:c", "späť", "secret-value.example"}
	var reqs []limiter.Request
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		for _, v := range values {
			reqs = append(reqs, limiter.Request{Key: key("edge", "rule", "user", v), Limit: limiter.Limit{Algorithm: alg, Requests: 100, Window: time.Minute}, Hits: 2})
		}
	}
	res := make([]limiter.Result, len(reqs))
	if err := b.Check(ctx, reqs, res); err != nil {
		t.Fatalf("Check: %v", err)
	}
	for i, x := range res {
		if !x.Allowed {
			t.Fatalf("request %d denied: %+v", i, x)
		}
	}
	if _, err := b.Beat(ctx, "instance-{1}", time.Minute); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	pattern := regexp.MustCompile(fmt.Sprintf(`^rls:(\{[A-Za-z0-9_-]{%d}\}|instances)$`, idLen))
	keys, err := r.Client().Keys(ctx, "*").Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	var scanned []string
	iter := r.Client().Scan(ctx, 0, "*", 100).Iterator()
	for iter.Next(ctx) {
		scanned = append(scanned, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	if len(scanned) != len(keys) {
		t.Fatalf("SCAN found %d keys, KEYS %d", len(scanned), len(keys))
	}
	// 6 values × (sliding, fixed, token, log) + instances.
	if want := len(values)*4 + 1; len(scanned) != want {
		t.Errorf("found %d keys, want %d: %v", len(scanned), want, scanned)
	}
	for _, k := range scanned {
		if !pattern.MatchString(k) {
			t.Errorf("key %q does not match %v", k, pattern)
		}
		for _, v := range values {
			if strings.Contains(k, v) {
				t.Errorf("key %q contains the descriptor value %q", k, v)
			}
		}
		ttl, err := r.Client().PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 {
			t.Errorf("key %q has no expiry (PTTL %v, %v)", k, ttl, err)
		}
	}
}

// TestRewriteInBucketKeepsExpiry: a window counter written again in its
// bucket gets its new count written in place (SETRANGE of the count's 8
// bytes: the bucket and the count before it are the stored ones) and keeps
// the expiry its bucket's first write gave it, to the millisecond; a new
// counter and a write in a new bucket write the key whole (SET PX), with a
// later expiry.
func TestRewriteInBucketKeepsExpiry(t *testing.T) {
	r := testenv.RedisServer(t)
	c := r.Client()
	ctx := context.Background()
	w := time.Minute
	start := time.UnixMilli(1_767_225_600_000 / w.Milliseconds() * w.Milliseconds()) // a bucket's start
	clock := start
	b := newSingle(t, r, DefaultKeyPrefix, func() time.Time { return clock })
	bucket := start.UnixMilli() / w.Milliseconds()
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			req := limiter.Request{Key: key(t.Name()), Limit: limiter.Limit{Algorithm: alg, Requests: 10, Window: w}, Hits: 1}
			k := baseKey(DefaultKeyPrefix, req)
			// check admits req at at with hits, checks the commands the call ran
			// to write the counter and the state stored, and returns the key's
			// expiry (Unix ms).
			check := func(step string, at time.Time, hits uint64, set, setrange int64, want [3]int64) int64 {
				t.Helper()
				clock, req.Hits = at, hits
				before := r.CommandCalls(t)
				res := make([]limiter.Result, 1)
				if err := b.Check(ctx, []limiter.Request{req}, res); err != nil || !res[0].Allowed {
					t.Fatalf("%s: %+v, %v; want admitted", step, res[0], err)
				}
				calls := r.CommandCalls(t)
				if n, m := calls["set"]-before["set"], calls["setrange"]-before["setrange"]; n != set || m != setrange {
					t.Errorf("%s: %d SET, %d SETRANGE; want %d and %d", step, n, m, set, setrange)
				}
				v, err := c.Get(ctx, k).Result()
				if err != nil {
					t.Fatalf("%s: GET: %v", step, err)
				}
				if st, ok := storedState(v); !ok || st != want {
					t.Errorf("%s: stored %v (%d bytes), want %v", step, st, len(v), want)
				}
				exp, err := c.PExpireTime(ctx, k).Result()
				if err != nil || exp <= 0 {
					t.Fatalf("%s: PEXPIRETIME %v, %v; want an expiry", step, exp, err)
				}
				return exp.Milliseconds()
			}
			// prev is what the state carries of the bucket before's n hits: the
			// sliding window keeps them, the fixed window writes 0.
			prev := func(n int64) int64 {
				if alg == limiter.SlidingWindow {
					return n
				}
				return 0
			}
			check("new counter", start.Add(-w+time.Second), 3, 1, 0, [3]int64{bucket - 1, 3, 0})
			first := check("next bucket", start.Add(10*time.Second), 1, 1, 0, [3]int64{bucket, 1, prev(3)})
			again := check("same bucket", start.Add(50*time.Second), 2, 0, 1, [3]int64{bucket, 3, prev(3)})
			if again != first {
				t.Errorf("in its bucket the key's expiry moved from %d to %d, want it kept", first, again)
			}
			if next := check("bucket after", start.Add(w+time.Second), 1, 1, 0, [3]int64{bucket + 1, 1, prev(3)}); next <= first {
				t.Errorf("bucket after: expiry %d, want later than %d", next, first)
			}
		})
	}
}
