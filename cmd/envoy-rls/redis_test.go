package main

import (
	"context"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

// TestServeOnRedis runs serve against a real redis-server: limits are exact,
// repeated denials of a hot key are answered by the deny cache without a
// Redis call, and /readyz follows Redis while decisions go on by failure
// mode.
func TestServeOnRedis(t *testing.T) {
	redis := testenv.RedisServer(t)
	r := serveOnRedis(t, redis, `
domain: r
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: deny}
`, func(o *serveOptions) {
		o.store.denyCacheEntries = 1000
		o.store.denyCacheMaxTTL = time.Hour // every denial below stays cached: the count is exact
	})
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
	if ok := r.admitted(t, 20, "r", "hot", "k"); ok != 5 {
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

// TestServeOnRedisUnixSocket: with a unix:// --redis.url, serve counts on
// a Redis on the same host over its socket, exactly.
func TestServeOnRedisUnixSocket(t *testing.T) {
	redis := testenv.RedisServer(t, testenv.WithUnixSocket())
	r := serveOnRedis(t, redis, `
domain: u
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
`, func(o *serveOptions) { o.store.redisURL = "unix://" + redis.Socket })
	r.fiveOfEightInRedis(t, redis, "u")
	// Over the socket: the server listens on TCP too, but none of
	// envoy-rls's connections came that way.
	redis.CheckClientsOnSocket(t)
}

// fiveOfEightInRedis sends 8 requests of descriptor (k, v) in domain, whose
// limit is 5 an hour, and fails the test unless 5 are admitted and each
// request was a check call (FCALL) in redis: the deny cache is off
// (serveOnRedis's default), so every request reaches Redis.
func (r *running) fiveOfEightInRedis(t *testing.T, redis *testenv.Redis, domain string) {
	t.Helper()
	before := redis.CommandCalls(t)["fcall"]
	if ok := r.admitted(t, 8, domain, "k", "v"); ok != 5 {
		t.Errorf("admitted %d of 8 under a limit of 5", ok)
	}
	if got := redis.CommandCalls(t)["fcall"] - before; got != 8 {
		t.Errorf("Redis ran %d check calls (FCALL) for 8 requests, want 8", got)
	}
}

// TestServeOnRedisTLS: with --redis.tls.* serve counts exactly on a Redis
// that serves TLS and asks for a client certificate, every connection on
// its TLS port. Given an authority that did not sign Redis's certificate,
// it starts all the same (a certificate can be renewed on the Redis side),
// decides by each rule's failure_mode, is not ready, counts the failed
// calls, and its log names the cause.
func TestServeOnRedisTLS(t *testing.T) {
	redis := testenv.RedisServer(t, testenv.WithTLS(true))
	yaml := `
domain: s
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: deny}
`
	withTLS := func(ca string) func(*serveOptions) {
		return func(o *serveOptions) {
			o.store.redisURL = "rediss://" + redis.TLSAddr
			o.store.redisTLS = tlsfiles.ClientFiles{CA: ca, Cert: redis.TLS.ClientCert, Key: redis.TLS.ClientKey}
		}
	}

	t.Run("verified", func(t *testing.T) {
		r := serveOnRedis(t, redis, yaml, withTLS(redis.TLS.CA))
		r.fiveOfEightInRedis(t, redis, "s")
		redis.CheckClientsOnTLS(t)
	})

	t.Run("another authority", func(t *testing.T) {
		var logs testenv.Buffer
		r := startServeLog(t, redisServeOptions(t, redis, yaml, withTLS(testenv.NewTLSFiles(t).CA)), &logs)
		resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "s", Descriptors: []*commonrl.RateLimitDescriptor{desc("strict", "v")}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("failure_mode deny answered %v without Redis", resp.OverallCode)
		}
		if ok := r.admitted(t, 1, "s", "k", "v"); ok != 1 {
			t.Errorf("failure_mode fallback admitted %d of 1", ok)
		}
		res, err := http.Get("http://" + r.addrs.HTTP + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d, want 503", res.StatusCode)
		}
		if v, _ := value(scrape(t, r), "envoy_rls_store_errors_total", "kind", "tls"); v < 1 {
			t.Errorf("envoy_rls_store_errors_total{kind=tls} = %v, want the failed calls", v)
		}
		if want := "certificate signed by unknown authority"; !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	})

	// Every --tls.check-interval the files are read with no connection
	// opened: a renewal is loaded and its expiry exported. With
	// authorities only, no certificate expiry is exported.
	t.Run("checked between connections", func(t *testing.T) {
		renewedCert, renewedKey := redis.TLS.RenewClient(t)
		c := redis.TLS.Copy(t)
		files := tlsfiles.ClientFiles{CA: c.CA, Cert: c.ClientCert, Key: c.ClientKey}
		r := serveOnRedis(t, redis, yaml, func(o *serveOptions) {
			o.store.redisURL = "rediss://" + redis.TLSAddr
			o.store.redisTLS = files
			o.tlsCheckInterval = 10 * time.Millisecond
		})
		testenv.CopyFile(t, renewedCert, files.Cert)
		testenv.CopyFile(t, renewedKey, files.Key)
		fams := scrapeUntil(t, r, "envoy_rls_redis_tls_reloads_total", 1, "result", "success")
		const expiry = "envoy_rls_redis_tls_client_certificate_expiry_timestamp_seconds"
		if v, _ := value(fams, expiry); v != notAfter(t, renewedCert) {
			t.Errorf("%s = %v, want the renewal's %v", expiry, v, notAfter(t, renewedCert))
		}

		caOnly := serveOnRedis(t, redis, yaml, func(o *serveOptions) {
			o.store.redisURL = "rediss://" + redis.TLSAddr
			o.store.redisTLS = tlsfiles.ClientFiles{CA: files.CA}
		})
		fams = scrape(t, caOnly)
		if _, ok := value(fams, expiry); ok {
			t.Errorf("with authorities only, %s is exported", expiry)
		}
		if v, ok := value(fams, "envoy_rls_redis_tls_last_reload_successful"); !ok || v != 1 {
			t.Errorf("with authorities only, envoy_rls_redis_tls_last_reload_successful = %v (exported: %v), want 1", v, ok)
		}
	})

	// The files are read again for each new connection to Redis: a
	// renewal written in place is used, and counted, from the next one;
	// a set that does not load leaves the last good one in use.
	t.Run("renewed", func(t *testing.T) {
		renewedCert, renewedKey := redis.TLS.RenewClient(t)
		c := redis.TLS.Copy(t)
		files := tlsfiles.ClientFiles{CA: c.CA, Cert: c.ClientCert, Key: c.ClientKey}
		var logs testenv.Buffer
		r := startServeLog(t, redisServeOptions(t, redis, yaml, func(o *serveOptions) {
			o.store.redisURL = "rediss://" + redis.TLSAddr
			o.store.redisTLS = files
		}), &logs)
		const expiry = "envoy_rls_redis_tls_client_certificate_expiry_timestamp_seconds"
		fams := scrape(t, r)
		for name, want := range map[string]float64{expiry: notAfter(t, redis.TLS.ClientCert), "envoy_rls_redis_tls_last_reload_successful": 1} {
			if v, ok := value(fams, name); !ok || v != want {
				t.Errorf("at start %s = %v (exported: %v), want %v", name, v, ok, want)
			}
		}
		// redial closes envoy-rls's connections to Redis and sends
		// requests, each of which may open one, until the series
		// name{labels} reads want.
		redial := func(step, name string, want float64, labels ...string) map[string]*dto.MetricFamily {
			t.Helper()
			if err := redis.Client().ClientKillByFilter(context.Background(), "TYPE", "normal").Err(); err != nil {
				t.Fatal(err)
			}
			for range 1000 {
				r.admitted(t, 1, "s", "k", "v")
				fams := scrape(t, r)
				if v, _ := value(fams, name, labels...); v == want {
					return fams
				}
			}
			t.Fatalf("%s: %s%v never read %v", step, name, labels, want)
			return nil
		}
		testenv.CopyFile(t, renewedCert, files.Cert)
		testenv.CopyFile(t, renewedKey, files.Key)
		fams = redial("renewed", "envoy_rls_redis_tls_reloads_total", 1, "result", "success")
		if v, _ := value(fams, expiry); v != notAfter(t, renewedCert) {
			t.Errorf("after the renewal %s = %v, want the renewal's %v", expiry, v, notAfter(t, renewedCert))
		}
		if !strings.Contains(logs.String(), `msg="Redis TLS: files reloaded" subject="CN=client"`) {
			t.Errorf("the log does not tell of the reload:\n%s", logs.String())
		}

		// The first certificate with the renewal's key does not load.
		testenv.CopyFile(t, redis.TLS.ClientCert, files.Cert)
		fams = redial("half-written", "envoy_rls_redis_tls_reloads_total", 1, "result", "failure")
		if v, _ := value(fams, "envoy_rls_redis_tls_last_reload_successful"); v != 0 {
			t.Errorf("after a failed load envoy_rls_redis_tls_last_reload_successful = %v, want 0", v)
		}
		if !strings.Contains(logs.String(), "Redis TLS: the changed files did not load; the previous ones are still in use") ||
			!strings.Contains(logs.String(), files.Cert) {
			t.Errorf("the log does not tell of the failed load, naming %s:\n%s", files.Cert, logs.String())
		}
		// New connections present the renewal still: a rule that denies
		// without Redis admits again.
		for i := 0; r.admitted(t, 1, "s", "strict", "renewed") != 1; i++ {
			if i == 1000 {
				t.Fatal("no request reached Redis with the last good files")
			}
		}
		// Put back: the failure is over, and nothing was reloaded.
		testenv.CopyFile(t, renewedCert, files.Cert)
		fams = redial("put back", "envoy_rls_redis_tls_last_reload_successful", 1)
		if v, _ := value(fams, "envoy_rls_redis_tls_reloads_total", "result", "success"); v != 1 {
			t.Errorf("files put back counted as a reload: reloads_total{success} = %v, want 1", v)
		}
		if v, _ := value(fams, expiry); v != notAfter(t, renewedCert) {
			t.Errorf("after the files were put back %s = %v, want the renewal's %v", expiry, v, notAfter(t, renewedCert))
		}
	})
}

// TestServeOnRedisHostileCounts: large counts get the answers the README
// promises, on the Redis backend as on the memory one, not an Internal error
// (which Envoy would treat by its failure mode, by default letting the
// request through): a monthly quota of millions, whose count × window passes
// 2^53 ms, is counted, and so is a limit override of that size on a window;
// a descriptor's hits_addend beyond every capacity (up to 2^64−1, perhaps
// from a client's header) is denied and consumes nothing; an override the
// matched rule's algorithm does not count (by the configuration's rules:
// descriptors.Countable), or whose window overflows, is InvalidArgument.
func TestServeOnRedisHostileCounts(t *testing.T) {
	r := serveOnRedis(t, testenv.RedisServer(t), `
domain: h
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket, burst: 7}
  - key: quota
    rate_limit: {unit: month, requests_per_unit: 5000000}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log}
`, nil)
	ctx := context.Background()
	for _, c := range []struct{ key, value string }{{"k", "a"}, {"tb", "a"}} {
		for _, hits := range []uint64{1 << 53, math.MaxUint64} {
			d := desc(c.key, c.value)
			d.HitsAddend = wrapperspb.UInt64(hits)
			resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*commonrl.RateLimitDescriptor{d}})
			if err != nil {
				t.Fatalf("%s: hits_addend %d: %v, want OVER_LIMIT", c.key, hits, err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("%s: hits_addend %d: %v, want OVER_LIMIT", c.key, hits, resp.OverallCode)
			}
		}
		// Nothing was consumed: the whole capacity is still there.
		resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*commonrl.RateLimitDescriptor{desc(c.key, c.value)}})
		if err != nil {
			t.Fatal(err)
		}
		want := uint32(4) // 5 an hour, one hit just taken
		if c.key == "tb" {
			want = 6 // a burst of 7
		}
		if st := resp.Statuses[0]; resp.OverallCode != rlsv3.RateLimitResponse_OK || st.LimitRemaining != want {
			t.Errorf("%s: after the denied requests: %v with %d remaining, want OK with %d", c.key, resp.OverallCode, st.LimitRemaining, want)
		}
	}
	// A monthly quota of millions (count × window beyond 2^53 ms) is
	// counted, not refused.
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*commonrl.RateLimitDescriptor{desc("quota", "a")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 4_999_999 {
		t.Errorf("5,000,000 a month: %v, %v; want OK with 4,999,999 remaining", resp, err)
	}
	// An override of a million a year (3.2e16 requests·ms) is counted on a
	// sliding window rule, as the configuration's windows are.
	d := desc("k", "c")
	d.Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1_000_000, Unit: typev3.RateLimitUnit_YEAR}
	resp, err = r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*commonrl.RateLimitDescriptor{d}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 999_999 {
		t.Errorf("override of 1,000,000 a year on a sliding window: %v, %v; want OK with 999,999 remaining", resp, err)
	}
	for _, c := range []struct {
		key string
		ov  *commonrl.RateLimitDescriptor_RateLimitOverride
	}{
		// On a token bucket, 3.2e16 > 2^53 requests·ms.
		{"tb", &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1_000_000, Unit: typev3.RateLimitUnit_YEAR}},
		// On a sliding log, beyond the 10,000 hits the configuration allows.
		{"log", &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 20_000, Unit: typev3.RateLimitUnit_MINUTE}},
		// A window beyond a time.Duration.
		{"k", &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)}},
	} {
		d := desc(c.key, "b")
		d.Limit = c.ov
		_, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*commonrl.RateLimitDescriptor{d}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[0].limit") {
			t.Errorf("%s: override %v: %v, want InvalidArgument naming descriptors[0].limit", c.key, c.ov, err)
		}
	}
}

// serveOnRedis starts serve on redis with the one configuration file yaml,
// Redis Functions (the default), a call timeout of a second, and a fallback
// of one instance; tune, if not nil, changes the options before the start.
func serveOnRedis(t *testing.T, redis *testenv.Redis, yaml string, tune func(*serveOptions)) *running {
	t.Helper()
	return startServe(t, redisServeOptions(t, redis, yaml, tune))
}

// redisServeOptions are serveOnRedis's options.
func redisServeOptions(t *testing.T, redis *testenv.Redis, yaml string, tune func(*serveOptions)) serveOptions {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.yaml"), yaml)
	o := serveOptions{configDir: dir}
	o.store.redisURL = "redis://" + redis.Addr
	o.store.redisTimeout = time.Second
	o.store.redisFunctions = true // the default: serve loads the library at start (Ping)
	o.store.fallbackInstances = 1
	if tune != nil {
		tune(&o)
	}
	return o
}

// TestServeBoundsRepeatedLines: callers that give up while Redis is stalled
// fail their checks one after another; with --log.repeat-interval the log
// has one "rate limit check failed" line for them, and the stop reports the
// ones held back. Redis is paused with one coalescing slot: the first
// request holds the slot in its call, and the next ones wait in the queue,
// which a caller's cancel leaves at once.
func TestServeBoundsRepeatedLines(t *testing.T) {
	redis := testenv.RedisServer(t)
	var log testenv.Buffer
	o := redisServeOptions(t, redis, "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n", func(o *serveOptions) {
		o.logRepeat = time.Hour
		o.store.redisSenders = 1
		o.store.redisTimeout = time.Minute // the callers give up first
	})
	r := startServeLog(t, o, &log)
	if ok := r.admitted(t, 1, "r", "k", "v"); ok != 1 {
		t.Fatalf("admitted %d of 1", ok)
	}
	checks := func() float64 {
		v, _ := value(scrape(t, r), "envoy_rls_redis_checks_total")
		return v
	}
	base := checks()
	redis.Pause()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			redis.Resume()
		}
	})
	// send starts a request and returns once it is in the store; cancel
	// ends it and returns its error.
	send := func(n float64) (cancel func() error) {
		ctx, stop := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "r", Descriptors: []*commonrl.RateLimitDescriptor{desc("k", "v")}})
			errc <- err
		}()
		scrapeUntil(t, r, "envoy_rls_redis_checks_total", base+n)
		return func() error { stop(); return <-errc }
	}
	lead := send(1)
	const queued = 3
	for i := range queued {
		if err := send(float64(2 + i))(); status.Code(err) != codes.Canceled {
			t.Fatalf("request %d: %v, want Canceled", i, err)
		}
	}
	scrapeUntil(t, r, "envoy_rls_requests_total", queued, "code", "Canceled")
	failed := func() []string {
		var out []string
		for _, l := range strings.Split(log.String(), "\n") {
			if strings.Contains(l, "rate limit check failed") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := failed(); len(got) != 1 || !strings.Contains(got[0], "domain=r code=Canceled") || strings.Contains(got[0], "suppressed") {
		t.Fatalf("lines for %d failed checks within the interval:\n%s\nwant one, code=Canceled", queued, strings.Join(got, "\n"))
	}

	lead() //nolint:errcheck // its call completes when Redis resumes, whatever the caller did
	redis.Resume()
	resumed = true
	r.stop()
	got := failed()
	if len(got) != 2 || !strings.HasSuffix(got[1], `kind="code=Canceled domain=r" suppressed=2`) {
		t.Fatalf("after the stop:\n%s\nwant the first line and the stop's report of the 2 held back", strings.Join(got, "\n"))
	}
}
