package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/denycache"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// redisOptions are the Redis backend's options the flags set (TLS apart).
func (o *storeOptions) redisOptions() redisbackend.Options {
	return redisbackend.Options{
		URL:            o.redisURL,
		ClusterAddrs:   o.redisClusterAddrs,
		SentinelAddrs:  o.redisSentinelAddrs,
		SentinelMaster: o.redisSentinelMaster,
		Username:       o.redisUsername,
		Password:       o.redisPassword,
		PoolSize:       o.redisPoolSize,
		Senders:        o.redisSenders,
		MaxBatch:       o.redisMaxBatch,
		SpareAfter:     o.redisSpareAfter,
		KeyPrefix:      o.redisKeyPrefix,
		Timeout:        o.redisTimeout,

		DisableFunctions: !o.redisFunctions,
	}
}

// openRedisStore connects to Redis and wraps it in the fail-soft layer, with
// an in-process fallback and the heartbeat loop that learns how many
// instances share the limits.
func openRedisStore(ctx context.Context, o storeOptions, log *slog.Logger, m *metrics.Metrics) (*store, error) {
	ro := o.redisOptions()
	var checkTLS func()
	if o.redisTLS.Set() {
		src, err := redisTLS(o.redisTLS, log, m)
		if err != nil {
			return nil, err
		}
		ro.TLS, checkTLS = src.Config, src.Check
	}
	rb, err := redisbackend.New(ro)
	if err != nil {
		return nil, err
	}
	mem := memorybackend.New(memorybackend.Options{})
	opened := false
	defer func() {
		if !opened {
			mem.Close()
			rb.Close()
		}
	}()
	fs, err := failsoft.New(failsoft.Options{
		Primary:   m.InstrumentStore(rb, time.Now),
		Fallback:  mem,
		Heartbeat: rb,
		Instances: o.fallbackInstances,
		Logger:    log,
		Observer:  m,
	})
	if err != nil {
		return nil, err
	}
	if err := m.InstancesFunc(fs.Instances); err != nil {
		return nil, err
	}
	if err := m.RedisCalls(func() metrics.RedisCallStats {
		st := rb.CallStats()
		return metrics.RedisCallStats{Checks: st.Checks, Calls: st.Calls, SpareCalls: st.SpareCalls, RefundErrors: st.RefundErrors, TryAgainRetries: st.TryAgainRetries}
	}); err != nil {
		return nil, err
	}
	if err := rb.Ping(ctx); err != nil {
		// Not fatal: the service starts and decides by failure_mode until
		// Redis answers, so a Redis restart never takes the gateway down.
		log.Warn("Redis is not reachable yet; deciding by each rule's failure_mode until it is", "err", err)
	} else if rb.UsesFunctions() {
		log.Info("Redis checks run as a Redis Function (FCALL)")
	} else {
		log.Info("Redis checks run as scripts (EVALSHA)", "reason", scriptsReason(o.redisFunctions))
	}
	var lim limiter.Limiter = fs
	if o.denyCacheEntries > 0 && (len(o.redisClusterAddrs) == 0 || o.denyCacheCluster) {
		// Outside the fail-soft layer: answers from the cache must not
		// count as store successes for the breaker, and are not store
		// calls for envoy_rls_store_duration_seconds.
		dc, err := denycache.New(fs, denycache.Options{MaxEntries: o.denyCacheEntries, MaxTTL: o.denyCacheMaxTTL})
		if err != nil {
			return nil, fmt.Errorf("--deny-cache.*: %w", err)
		}
		if err := m.DenyCache(func() metrics.DenyCacheStats {
			st := dc.Stats()
			return metrics.DenyCacheStats{Answered: st.Answered, Forwarded: st.Forwarded, Skipped: st.Skipped, Entries: dc.Len()}
		}); err != nil {
			return nil, err
		}
		lim = dc
	}
	opened = true
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := fs.Run(runCtx); err != nil && runCtx.Err() == nil {
			log.Error("heartbeat loop stopped", "err", err)
		}
	}()
	return &store{
		name:     "redis",
		limiter:  lim,
		ready:    rb.Ping,
		checkTLS: checkTLS,
		closers: []func() error{
			rb.Close,
			mem.Close,
			func() error {
				cancel()
				wg.Wait()
				// Leave the instance set so the others' share grows at once.
				ctx, c := context.WithTimeout(context.Background(), o.redisTimeout)
				defer c()
				_, err := rb.Leave(ctx, fs.InstanceID())
				if err != nil {
					log.Debug("leaving the instance set", "err", err)
				}
				return nil
			},
		},
	}, nil
}

// redisTLS returns the source of each new Redis connection's TLS
// configuration: the --redis.tls.* files, read again when they change,
// each load logged and counted.
func redisTLS(f tlsfiles.ClientFiles, log *slog.Logger, m *metrics.Metrics) (*tlsfiles.ClientSource, error) {
	tm, err := m.RedisTLS(f.Cert != "")
	if err != nil {
		return nil, err
	}
	src, err := tlsfiles.NewClientSource(f, logTLSLoads(log, "Redis TLS", tm,
		"ca", f.CA, "cert", f.Cert, "server_name", f.ServerName, "insecure_skip_verify", f.Insecure))
	if err != nil {
		return nil, fmt.Errorf("--redis.tls.*: %w", err)
	}
	return src, nil
}

// scriptsReason says why checks run as scripts rather than as a Function.
func scriptsReason(functionsFlag bool) string {
	if !functionsFlag {
		return "--redis.functions=false"
	}
	return "the server does not support Redis Functions or the ACL forbids FUNCTION/FCALL"
}
