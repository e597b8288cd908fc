package denycache

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
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

// TestHammerProductionStack hammers the stack serve builds on a Redis: the
// deny cache in front of the fail-soft layer in front of the Redis backend,
// 4 instances (each with its own client, cache and fallback) sharing one
// redis-server, 32 goroutines each, on one key, for every algorithm and a
// token bucket whose burst differs from its rate, with 1 and 3 requests per
// batch. limitertest.Hammer checks the admitted total and the counters
// against the reference model exactly. (The layers were hammered each on
// its own before: the cache over the memory backend, the backend alone.)
func TestHammerProductionStack(t *testing.T) {
	r := testenv.RedisServer(t)
	type load struct {
		alg   limiter.Algorithm
		burst uint64
	}
	loads := []load{{alg: limiter.TokenBucket, burst: 300}}
	for _, alg := range algorithms {
		loads = append(loads, load{alg: alg})
	}
	for _, ld := range loads {
		for _, per := range []int{1, 3} {
			name := fmt.Sprintf("%v/batch%d", ld.alg, per)
			if ld.burst > 0 {
				name = fmt.Sprintf("%v_burst%d/batch%d", ld.alg, ld.burst, per)
			}
			t.Run(name, func(t *testing.T) {
				clock := limitertest.NewClock(time.UnixMilli(start))
				prefix := fmt.Sprintf("stack-%s:", strings.ReplaceAll(name, "/", "-"))
				ls := make([]limiter.Limiter, 4)
				for i := range ls {
					rb, err := redisbackend.New(redisbackend.Options{URL: "redis://" + r.Addr, KeyPrefix: prefix, Now: clock.Now})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { rb.Close() })
					mem := memorybackend.New(memorybackend.Options{Now: clock.Now})
					t.Cleanup(func() { mem.Close() })
					fs, err := failsoft.New(failsoft.Options{Primary: rb, Fallback: mem, Heartbeat: rb, Now: clock.Now})
					if err != nil {
						t.Fatal(err)
					}
					ls[i] = newCache(t, fs, clock, Options{})
				}
				limitertest.Hammer(t, ls, clock, limitertest.HammerOptions{
					Algorithm:  ld.alg,
					Burst:      ld.burst,
					Goroutines: 32,
					Limit:      1000,
					Window:     time.Minute,
					Windows:    2,
					PerBatch:   per,
				})
			})
		}
	}
}
