package main

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/flagvalue"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// storeOptions are the flags that choose and tune the counting store.
type storeOptions struct {
	redisURL            string
	redisClusterAddrs   flagvalue.List
	redisSentinelAddrs  flagvalue.List
	redisSentinelMaster string
	redisUsername       string
	redisPassword       string
	redisTLS            tlsfiles.ClientFiles
	redisPoolSize       int
	redisSenders        int
	redisMaxBatch       int
	redisSpareAfter     time.Duration
	redisKeyPrefix      string
	redisTimeout        time.Duration
	redisFunctions      bool
	fallbackInstances   int
	denyCacheEntries    int
	denyCacheMaxTTL     time.Duration
	denyCacheCluster    bool
}

func (o *storeOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.redisURL, "redis.url", "", "single-node Redis: redis://[user:password@]host:port[/db], rediss:// for TLS, or unix:///path/to/redis.sock[?db=N] for a Redis on the same host; empty with no other --redis.* topology runs on the in-memory backend")
	fs.Var(&o.redisClusterAddrs, "redis.cluster-addrs", "Redis Cluster seed nodes, host:port,host:port (comma-separated or repeated)")
	fs.Var(&o.redisSentinelAddrs, "redis.sentinel-addrs", "Redis Sentinel addresses, host:port,host:port, comma-separated or repeated (with --redis.sentinel-master)")
	fs.StringVar(&o.redisSentinelMaster, "redis.sentinel-master", "", "the master name Sentinel monitors")
	fs.StringVar(&o.redisUsername, "redis.username", "", "Redis ACL user (overrides the URL's)")
	fs.StringVar(&o.redisPassword, "redis.password", "", "Redis password (overrides the URL's); prefer the environment variable")
	o.redisTLS.Register(fs, "redis.tls.", "Redis")
	fs.IntVar(&o.redisPoolSize, "redis.pool-size", 0, "connections per Redis node (0: 10 per CPU)")
	fs.IntVar(&o.redisSenders, "redis.senders", redisbackend.DefaultSenders, "coalesced calls in flight at once: requests that arrive while that many are in flight go together in the next one, each still decided atomically (single node and Sentinel: one script call; each of these calls keeps a connection, so it must be below the pool's size: --redis.pool-size, else pool_size in --redis.url, and below max_active_conns in --redis.url if set; Cluster: one pipeline of the requests' per-slot calls); -1 sends every request as a call of its own (one per hash slot on a Cluster)")
	fs.IntVar(&o.redisMaxBatch, "redis.max-batch", redisbackend.DefaultMaxBatch, "most limits one coalesced call decides (a larger request is sent alone)")
	fs.DurationVar(&o.redisSpareAfter, "redis.spare-after", 0, "how long every coalesced call in flight must have taken before another of the --redis.senders slots starts one (e.g. 1ms): while Redis answers sooner, one call at a time carries every waiting request, which spares Redis CPU, and a stalled call holds the requests behind it up for no longer than this; 0 lets every slot start a call at once, for the shortest tail")
	fs.StringVar(&o.redisKeyPrefix, "redis.key-prefix", "rls:", "prefix of every Redis key")
	fs.DurationVar(&o.redisTimeout, "redis.timeout", 25*time.Millisecond, "upper bound of one Redis call, kept well under Envoy's rate-limit timeout so a slow Redis becomes a failure_mode answer in time; the incoming gRPC deadline (minus 5ms) may shorten it")
	fs.BoolVar(&o.redisFunctions, "redis.functions", true, "run the check as a Redis Function (FCALL, Redis >= 7.0; loaded with FUNCTION LOAD on first use); servers without Functions or whose ACL forbids them are detected and served with EVALSHA; false always uses EVALSHA")
	fs.IntVar(&o.denyCacheEntries, "deny-cache.max-entries", 100000, "counters remembered as denied until their exact retry instant, answered without Redis (0 disables the cache)")
	fs.DurationVar(&o.denyCacheMaxTTL, "deny-cache.max-ttl", time.Second, "longest time a denial is answered from the cache; bounds over-denial when a counter is reset behind envoy-rls's back")
	fs.BoolVar(&o.denyCacheCluster, "deny-cache.cluster", false, "use the deny cache with --redis.cluster-addrs too (a cross-slot refund can end a denial before the cached instant; --deny-cache.max-ttl bounds the over-denial)")
	fs.IntVar(&o.fallbackInstances, "fallback.instances", 0, "number of envoy-rls instances sharing the limits while Redis is unavailable (0: learn it from Redis heartbeats)")
}

func (o *storeOptions) redisConfigured() bool {
	return o.redisURL != "" || len(o.redisClusterAddrs) > 0 || len(o.redisSentinelAddrs) > 0
}

// store is the limiter the service counts with, and how to tell whether it
// is ready.
type store struct {
	name    string
	limiter limiter.Limiter
	ready   func(context.Context) error
	closers []func() error
	// checkTLS, when not nil, reads the Redis TLS files now, loading a
	// change as a new connection would.
	checkTLS func()
}

// Close releases the store's connections and goroutines.
func (s *store) Close() error {
	var first error
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func openStore(ctx context.Context, o storeOptions, log *slog.Logger, m *metrics.Metrics) (*store, error) {
	if !o.redisConfigured() {
		mem := memorybackend.New(memorybackend.Options{})
		log.Warn("no Redis configured: counting in process, so every envoy-rls instance enforces its own limits; set --redis.url for shared limits")
		return &store{
			name:    "memory",
			limiter: mem,
			ready:   func(context.Context) error { return nil },
			closers: []func() error{mem.Close},
		}, nil
	}
	return openRedisStore(ctx, o, log, m)
}
