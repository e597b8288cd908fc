package denycache

import (
	"fmt"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

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
			// Load the code into Redis first: a "Function not found" answer
			// followed by FUNCTION LOAD and FCALL counts as two calls.
			check(t, plain, limiter.Request{Key: "warm-up", Limit: l, Hits: 0})
			before := r.ScriptCalls(t)
			got := run(cached)
			calls := r.ScriptCalls(t) - before
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

// TestRedisRealClock checks the timing argument on real clocks: a Cache on
// time.Now in front of redis-server deciding at the real time (read when
// each call is sent, floored to the millisecond as Redis TIME is). Whenever
// the Cache has answered a denial locally and its entry is still valid
// after the answer, a check-only request decided by Redis at exactly that
// later instant must be denied too.
func TestRedisRealClock(t *testing.T) {
	r := testenv.RedisServer(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			prefix := "real-" + alg.String() + ":"
			b, err := redisbackend.New(redisbackend.Options{URL: "redis://" + r.Addr, KeyPrefix: prefix, Now: time.Now})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			// The prober decides at the instant the test chooses.
			var probeAt time.Time
			prober, err := redisbackend.New(redisbackend.Options{URL: "redis://" + r.Addr, KeyPrefix: prefix,
				Now: func() time.Time { return probeAt }})
			if err != nil {
				t.Fatal(err)
			}
			defer prober.Close()
			c, err := New(b, Options{})
			if err != nil {
				t.Fatal(err)
			}
			q := limiter.Request{Key: "hot", Limit: limiter.Limit{Algorithm: alg, Requests: 3, Window: 50 * time.Millisecond}, Hits: 1}
			probe := q
			probe.Hits = 0
			id := c.identOf(&q)
			s := c.shardOf(id)
			probes := 0
			for range 3000 {
				before := c.Stats().Answered
				res := check(t, c, q)[0]
				if c.Stats().Answered == before {
					continue // the store decided
				}
				if res.Allowed {
					t.Fatalf("a local answer admitted: %+v", res)
				}
				s.mu.Lock()
				e, ok := s.m[id]
				s.mu.Unlock()
				probeAt = time.Now()
				if !ok || int64(probeAt.Sub(c.epoch)) > e.until {
					continue
				}
				probes++
				if p := check(t, prober, probe)[0]; p.Allowed {
					t.Fatalf("the Cache's entry is valid for %v more (%v after its store call), but Redis admits then: %+v",
						time.Duration(e.until-int64(probeAt.Sub(c.epoch))), time.Duration(e.until-e.at), p)
				}
			}
			if probes == 0 {
				t.Fatal("no local answer was probed")
			}
			t.Logf("%d local answers confirmed by Redis", probes)
		})
	}
}
