package main

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestServeOnRedis runs serve against a real redis-server: limits are exact,
// repeated denials of a hot key are answered by the deny cache without a
// Redis call, and /readyz follows Redis while decisions go on by failure
// mode.
func TestServeOnRedis(t *testing.T) {
	redis := testenv.RedisServer(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "r.yaml"), `
domain: r
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: deny}
`)
	o := serveOptions{configDir: dir}
	o.store.redisURL = "redis://" + redis.Addr
	o.store.redisTimeout = time.Second
	o.store.redisFunctions = true // the default: serve loads the library at start (Ping)
	o.store.denyCacheEntries = 1000
	o.store.denyCacheMaxTTL = time.Hour // every denial below stays cached: the count is exact
	o.store.fallbackInstances = 1
	r := startServe(t, o)
	call := func(kv ...string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "r", Descriptors: []*commonrl.RateLimitDescriptor{desc(kv...)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}

	// Checks run as FCALL; the heartbeat (a script, EVALSHA) beats at
	// start in its own goroutine, so it is left out of the count.
	fcalls := func() int64 { return redis.CommandCalls(t)["fcall"] }
	before := fcalls()
	ok := 0
	for range 20 {
		if call("hot", "k") == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 5 {
		t.Errorf("admitted %d of 20 under a limit of 5", ok)
	}
	// 5 admitted and the first denial reached Redis; the other 14 denials
	// were answered from the cache.
	if got := fcalls() - before; got != 6 {
		t.Errorf("Redis ran %d check calls (FCALL) for 20 requests, want 6", got)
	}
	fams := scrape(t, r)
	if v, _ := value(fams, "envoy_rls_deny_cache_answered_total"); v != 14 {
		t.Errorf("deny cache answered %v, want 14", v)
	}

	get := func(path string) int {
		resp, err := http.Get("http://" + r.addrs.HTTP + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d with Redis up", code)
	}
	redis.Stop()
	if code := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d with Redis stopped, want 503", code)
	}
	// Redis down: the deny rule denies, the fallback rule still admits
	// (a fresh in-process count, --fallback.instances 1), nothing fails.
	if c := call("strict", "x"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("failure_mode deny answered %v with Redis stopped", c)
	}
	if c := call("hot", "other"); c != rlsv3.RateLimitResponse_OK {
		t.Errorf("failure_mode fallback answered %v with Redis stopped", c)
	}
	redis.Start()
	if code := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d after Redis came back", code)
	}
}
