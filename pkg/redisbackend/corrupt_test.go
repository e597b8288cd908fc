package redisbackend

import (
	"context"
	"encoding/binary"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// packed returns three integers in the stored form of a counter (state_format
// in lua/lib.lua).
func packed(x, y, z uint64) string {
	b := make([]byte, 0, 24)
	for _, v := range []uint64{x, y, z} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return string(b)
}

// TestForeignCounterValues: a counter key holding a value envoy-rls never
// writes (another program sharing the prefix, a hand edit) counts as an
// empty counter, and the next admitted hit overwrites it. In particular a
// 24-byte value whose integers lie beyond 2^53 must not reach the scripts'
// arithmetic: there t + 1 == t, and the sliding window's search for the
// retry instant would loop, holding Redis BUSY for every client.
func TestForeignCounterValues(t *testing.T) {
	r := testenv.RedisServer(t)
	var ps prefixes
	foreign := map[string]string{
		"24 bytes of text":     "xxxxxxxxxxxxxxxxxxxxxxxx",
		"bucket beyond 2^53":   packed(1<<62, 1, 1),
		"negative bucket":      packed(math.MaxUint64, 5, 5),
		"count beyond 2^53":    packed(1, 1<<60, 0),
		"negative count":       packed(1, 1, math.MaxUint64),
		"bucket·window > 2^53": packed(1<<44, 1, 1),
		"short":                "short",
	}
	// 367 days ahead of the clock: the bucket (windows) or the last write
	// (token bucket) of no clock error.
	ahead := uint64(time.Now().Add(367 * 24 * time.Hour).UnixMilli())
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket} {
		cases := maps.Clone(foreign)
		if alg == limiter.TokenBucket {
			cases["a year ahead"] = packed(ahead, 1, 1)
		} else {
			cases["a year ahead"] = packed(ahead/uint64(time.Minute.Milliseconds()), 1, 1)
		}
		for name, v := range cases {
			t.Run(alg.String()+"/"+name, func(t *testing.T) {
				overwritten(t, r, ps.next(), alg, func(ctx context.Context, c *redis.Client, k string) error {
					return c.Set(ctx, k, v, time.Minute).Err()
				}, func(ctx context.Context, c *redis.Client, k string) {
					got, err := c.Get(ctx, k).Result()
					if err != nil {
						t.Fatalf("GET: %v", err)
					}
					if _, ok := storedState(got); !ok || got == v {
						t.Errorf("stored value %q after the Check: want a counter envoy-rls wrote", got)
					}
				})
			})
		}
	}
}

// TestForeignKeyTypes: a counter key of another Redis type than the
// algorithm's counts as an empty counter and is replaced by the next
// admitted hit. It must not fail the call (WRONGTYPE), which would fail
// every coalesced request it carries, other clients' too.
func TestForeignKeyTypes(t *testing.T) {
	r := testenv.RedisServer(t)
	var ps prefixes
	types := map[string]func(ctx context.Context, c *redis.Client, k string) error{
		"string": func(ctx context.Context, c *redis.Client, k string) error {
			return c.Set(ctx, k, "v", time.Minute).Err()
		},
		"list": func(ctx context.Context, c *redis.Client, k string) error { return c.RPush(ctx, k, "a", "b").Err() },
		"hash": func(ctx context.Context, c *redis.Client, k string) error { return c.HSet(ctx, k, "f", "1").Err() },
		"sorted set": func(ctx context.Context, c *redis.Client, k string) error {
			return c.ZAdd(ctx, k, redis.Z{Score: 1, Member: "x"}).Err()
		},
	}
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		own, want := "string", "string" // the algorithm's type: its name here and TYPE's
		if alg == limiter.SlidingLog {
			own, want = "sorted set", "zset"
		}
		for name, write := range types {
			if name == own {
				continue
			}
			t.Run(alg.String()+"/"+name, func(t *testing.T) {
				overwritten(t, r, ps.next(), alg, write, func(ctx context.Context, c *redis.Client, k string) {
					if got, err := c.Type(ctx, k).Result(); err != nil || got != want {
						t.Errorf("TYPE after the Check = %q, %v; want %s", got, err, want)
					}
				})
			})
		}
	}
}

// firstKey makes a first Check of req on b, whose keys start with prefix,
// and returns a client of r and the key of req's counter.
func firstKey(t *testing.T, r *testenv.Redis, b *Backend, prefix string, req limiter.Request) (*redis.Client, string) {
	t.Helper()
	if err := b.Check(context.Background(), []limiter.Request{req}, make([]limiter.Result, 1)); err != nil {
		t.Fatalf("first Check: %v", err)
	}
	return r.Client(), baseKey(prefix, req)
}

// overwritten counts one hit on a fresh counter of alg (limit 3 a minute)
// under prefix, overwrites its key with write, and checks that the next
// Check answers as on an empty counter (admitted, 2 remaining), that the
// counter then holds exactly that hit, and stored (the key as envoy-rls
// rewrote it).
func overwritten(t *testing.T, r *testenv.Redis, prefix string, alg limiter.Algorithm,
	write func(ctx context.Context, c *redis.Client, k string) error,
	stored func(ctx context.Context, c *redis.Client, k string)) {
	t.Helper()
	b := newSingle(t, r, prefix, nil)
	req := limiter.Request{Key: key("foreign"), Limit: limiter.Limit{Algorithm: alg, Requests: 3, Window: time.Minute}, Hits: 1}
	ctx := context.Background()
	res := make([]limiter.Result, 1)
	c, k := firstKey(t, r, b, prefix, req)
	if err := c.Del(ctx, k).Err(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if err := write(ctx, c, k); err != nil {
		t.Fatalf("writing the foreign key: %v", err)
	}

	// A script that loops is stopped when the test fails, so that it
	// does not hold the server BUSY for the tests after it.
	t.Cleanup(func() {
		if t.Failed() {
			c.FunctionKill(context.Background())
		}
	})
	if err := b.Check(ctx, []limiter.Request{req}, res); err != nil {
		t.Fatalf("Check over the foreign key: %v", err)
	}
	if !res[0].Allowed || res[0].Remaining != 2 {
		t.Errorf("Check over the foreign key: %+v, want allowed with 2 remaining (an empty counter plus this hit)", res[0])
	}
	stored(ctx, c, k)
	if n := used(t, b, req); n != 1 {
		t.Errorf("counter holds %d hits, want 1", n)
	}
}

// TestForeignSlidingLogMembers: a sliding log holding a member envoy-rls
// never writes counts as an empty log and is replaced by the next admitted
// batch, as a foreign string counter is; a Check over it ends and sets an
// expiry. (Under one member per hit, a member named with a sequence number
// beyond 2^53 made the store loop forever, and a score far ahead, up to inf,
// failed every admission on PEXPIRE's range or deleted the log by a
// negative expiry.) Each case is the newest member, or out of order with
// it, so the load reads it.
func TestForeignSlidingLogMembers(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := time.UnixMilli(1_767_225_600_123)
	now := float64(clock.UnixMilli())
	var ps prefixes
	for name, z := range map[string]redis.Z{
		"not a batch":              {Score: now, Member: "x"},
		"start of 17 digits":       {Score: now, Member: "99999999999999999:1"},
		"start beyond the maximum": {Score: now, Member: "9999999999999999:1"},
		"count 0":                  {Score: now, Member: "0000000000000005:0"},
		"score 1e19":               {Score: 1e19, Member: "0000000000000001:1"},
		"score inf":                {Score: math.Inf(1), Member: "0000000000000001:1"},
		"score not an integer":     {Score: now + 0.5, Member: "0000000000000001:1"},
		"out of order":             {Score: now - 1, Member: "0000000000000007:1"},
	} {
		t.Run(name, func(t *testing.T) {
			prefix := ps.next()
			b := newSingle(t, r, prefix, func() time.Time { return clock })
			req := limiter.Request{Key: key("log"), Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10, Window: time.Minute}, Hits: 1}
			ctx := context.Background()
			res := make([]limiter.Result, 1)
			c, k := firstKey(t, r, b, prefix, req)
			if err := c.ZAdd(ctx, k, z).Err(); err != nil {
				t.Fatalf("ZADD: %v", err)
			}
			req.Hits = 3
			if err := b.Check(ctx, []limiter.Request{req}, res); err != nil {
				t.Fatalf("Check over the foreign member: %v", err)
			}
			if !res[0].Allowed || res[0].Remaining != 7 {
				t.Errorf("Check over the foreign member: %+v, want allowed with 7 remaining (an empty log, 3 hits)", res[0])
			}
			v, err := c.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil || len(v) != 1 || v[0].Member != "0000000000000000:3" || v[0].Score != now {
				t.Errorf("log after the Check: %v, %v; want the one batch of 3 hits at now", v, err)
			}
			if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
				t.Errorf("PTTL %v, %v; want an expiry", ttl, err)
			}
		})
	}
}
