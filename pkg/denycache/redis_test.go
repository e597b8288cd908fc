package denycache

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// scriptCalls returns how many EVALSHA and EVAL commands Redis has run.
func scriptCalls(t *testing.T, r *testenv.Redis) int64 {
	t.Helper()
	info, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats: %q: %v", line, err)
		}
		n += v
	}
	return n
}

// TestRedisHotKey hammers one key far over its limit through a Cache in
// front of a real redis-server (on an injected clock shared with the Cache,
// so the run is deterministic), then replays the same traffic without the
// Cache under another key prefix. The decisions must be identical, Redis
// must have run exactly one script per call the Cache forwarded, and the
// hot denied key must have reached Redis only once per retry interval.
func TestRedisHotKey(t *testing.T) {
	r := testenv.RedisServer(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			clock := limitertest.NewClock(time.UnixMilli(start))
			backend := func(prefix string) *redisbackend.Backend {
				b, err := redisbackend.New(redisbackend.Options{URL: "redis://" + r.Addr, KeyPrefix: prefix,
					Now: clock.Now, Timeout: -1})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				return b
			}
			counted := &counting{next: backend(fmt.Sprintf("cached-%v:", alg)), clock: clock}
			cached := newCache(t, counted, clock, Options{})
			plain := backend(fmt.Sprintf("plain-%v:", alg))

			l := limiter.Limit{Algorithm: alg, Requests: 10, Window: 500 * time.Millisecond}
			q := limiter.Request{Key: "hot", Limit: l, Hits: 1}
			const perMs, millis = 4, 1500
			run := func(lim limiter.Limiter) []limiter.Result {
				clock.SetMillis(start)
				var out []limiter.Result
				for range millis {
					for range perMs {
						out = append(out, check(t, lim, q)[0])
					}
					clock.Advance(time.Millisecond)
				}
				return out
			}
			// Load the script into Redis first: a NOSCRIPT answer followed
			// by EVAL counts as two commands.
			check(t, plain, limiter.Request{Key: "warm-up", Limit: l, Hits: 0})
			before := scriptCalls(t, r)
			got := run(cached)
			calls := scriptCalls(t, r) - before
			want := run(plain)
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("request %d at +%dms: cached %+v, uncached %+v", i, i/perMs, got[i], want[i])
				}
			}
			log := counted.log()
			if calls != int64(len(log)) {
				t.Fatalf("Redis ran %d scripts for %d forwarded calls", calls, len(log))
			}
			denied := 0
			for _, res := range got {
				if !res.Allowed {
					denied++
				}
			}
			forwarded := forwardedDenials(t, log, 0)
			if forwarded == 0 || denied < 20*forwarded {
				t.Fatalf("%d denials, %d reached Redis", denied, forwarded)
			}
			t.Logf("%d requests, %d denied: Redis ran %d scripts (%d for denials)", len(got), denied, calls, forwarded)
		})
	}
}
