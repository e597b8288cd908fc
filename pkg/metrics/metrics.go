package metrics

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Metrics records what the service does. Create it with New.
type Metrics struct {
	decisions       counters[decisionLabels]
	nearLimit       counters[nearLimitLabels]
	unknownDomain   prometheus.Counter
	requests        counters[codeLabel]
	requestDuration prometheus.Histogram
	storeDuration   prometheus.Histogram
	storeErrors     *prometheus.CounterVec
	fallbackActive  prometheus.Gauge
	breakerState    *prometheus.GaugeVec
	reloads         reloads
	lastReloadTime  prometheus.Gauge
	rules           *prometheus.GaugeVec
	ruleDomains     map[string]int // the last load's rules by domain, which rules has series of (Reloaded)
	registerer      prometheus.Registerer
}

// counters is a counter family whose children are looked up on the request
// path: by every decision (three times for a request of three descriptors)
// and every request. CounterVec.WithLabelValues hashes each label value byte
// by byte (FNV) and takes the family's lock on every call, 2.4% of
// envoy-rls's CPU under make bench's three descriptors; a sync.Map keyed by
// the label values, which the runtime hashes with AES instructions and reads
// without a lock, hands out the same children (246 against 88 ns per
// decision, BenchmarkDecision). It holds one entry per child the family
// holds, so it is bounded as the family is (by the configuration, see the
// package doc). Nothing may Reset or Delete from these families: the cache
// would keep handing out children the registry no longer collects.
type counters[L labels] struct {
	vec   *prometheus.CounterVec
	cache *sync.Map // L → prometheus.Counter
}

// labels are the label values of one child of a counters family, as a
// comparable key; values lists them in the family's label order.
type labels interface {
	comparable
	values() []string
}

func newCounters[L labels](opts prometheus.CounterOpts, names ...string) counters[L] {
	return counters[L]{vec: prometheus.NewCounterVec(opts, names), cache: &sync.Map{}}
}

// get returns the child of label values l, creating it on first use.
func (c counters[L]) get(l L) prometheus.Counter {
	if v, ok := c.cache.Load(l); ok {
		return v.(prometheus.Counter)
	}
	v, _ := c.cache.LoadOrStore(l, c.vec.WithLabelValues(l.values()...))
	return v.(prometheus.Counter)
}

// decisionLabels are envoy_rls_decisions_total's label values.
type decisionLabels struct{ domain, rule, limit, decision, source string }

func (l decisionLabels) values() []string {
	return []string{l.domain, l.rule, l.limit, l.decision, l.source}
}

// nearLimitLabels are envoy_rls_near_limit_total's label values.
type nearLimitLabels struct{ domain, rule, limit string }

func (l nearLimitLabels) values() []string { return []string{l.domain, l.rule, l.limit} }

// codeLabel is envoy_rls_requests_total's label value.
type codeLabel string

func (l codeLabel) values() []string { return []string{string(l)} }

// breakerStates are the values of the state label of
// envoy_rls_circuit_breaker_state.
var breakerStates = []string{"closed", "half-open", "open"}

// latencyBuckets are the bounds of both latency histograms, in seconds: 25µs
// to 1s, nine to a decade (1, 1.5, 2, 2.5, 3, 4, 5, 6 and 8 times a power of
// ten), so that no bucket is more than 1.5 times as wide as the one below and
// a quantile estimated within one is off by at most a third. A decision takes
// tens of microseconds in process and a few hundred with a Redis round trip.
// Round bounds land on the figures operators set thresholds at: 1ms (a p99
// target), 5ms (the margin the fail-soft layer keeps before Envoy's
// deadline), 10ms and 20ms (the shipped alerts' thresholds), 25ms
// (--redis.timeout's default).
var latencyBuckets = []float64{
	25e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6,
	100e-6, 150e-6, 200e-6, 250e-6, 300e-6, 400e-6, 500e-6, 600e-6, 800e-6,
	1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3, 4e-3, 5e-3, 6e-3, 8e-3,
	10e-3, 15e-3, 20e-3, 25e-3, 30e-3, 40e-3, 50e-3, 60e-3, 80e-3,
	100e-3, 150e-3, 200e-3, 250e-3, 300e-3, 400e-3, 500e-3, 600e-3, 800e-3,
	1,
}

// New creates the metric families and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		registerer: reg,
		decisions: newCounters[decisionLabels](prometheus.CounterOpts{
			Name: "envoy_rls_decisions_total",
			Help: "Decisions on configured limits and descriptors, by domain, rule, limit, decision (ok, over_limit, shadow_over_limit, unlimited, no_rule) and source (store, fallback, failure_mode_allow, failure_mode_deny; empty for unlimited and no_rule).",
		}, "domain", "rule", "limit", "decision", "source"),
		nearLimit: newCounters[nearLimitLabels](prometheus.CounterOpts{
			Name: "envoy_rls_near_limit_total",
			Help: "Admitted decisions after which the client had used at least --metrics.near-limit-ratio (default 0.8) of the limit: who runs close to their limit, before they are denied.",
		}, "domain", "rule", "limit"),
		unknownDomain: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "envoy_rls_unknown_domain_requests_total",
			Help: "Requests whose domain is not configured (answered OK). The domain is client input and is therefore not a label; the log names each unknown domain once.",
		}),
		requests: newCounters[codeLabel](prometheus.CounterOpts{
			Name: "envoy_rls_requests_total",
			Help: "ShouldRateLimit calls by response: OK, OVER_LIMIT, or the gRPC error code (InvalidArgument, DeadlineExceeded, ...).",
		}, "code"),
		requestDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "envoy_rls_request_duration_seconds",
			Help:    "Time to answer one ShouldRateLimit call, from the gRPC handler's start to its return.",
			Buckets: latencyBuckets,
		}),
		storeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "envoy_rls_store_duration_seconds",
			Help:    "Time one request waited for the shared store, successful or not: its Redis round trip, including the wait for a coalesced call (Cluster: its slots' calls).",
			Buckets: latencyBuckets,
		}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_rls_store_errors_total",
			Help: "Store calls that failed, by kind: timeout, connection, tls, cluster, other, circuit_open (kept from the store by the open circuit breaker).",
		}, []string{"kind"}),
		fallbackActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "envoy_rls_fallback_active",
			Help: "1 while the store is unavailable and decisions follow each rule's failure_mode, else 0.",
		}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "envoy_rls_circuit_breaker_state",
			Help: "1 for the circuit breaker's current state (closed, half-open, open), 0 for the others.",
		}, []string{"state"}),
		reloads: newReloads(
			prometheus.CounterOpts{
				Name: "envoy_rls_config_reloads_total",
				Help: "Configuration loads after the first, by result (success, failure). An unchanged folder is not counted.",
			},
			prometheus.GaugeOpts{
				Name: "envoy_rls_config_last_reload_successful",
				Help: "1 if the last configuration load succeeded, 0 if it failed (the previous configuration is still served).",
			}),
		lastReloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "envoy_rls_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful configuration load.",
		}),
		rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "envoy_rls_config_rules",
			Help: "Rules loaded, by domain.",
		}, []string{"domain"}),
	}
	if err := m.register(m.decisions.vec, m.nearLimit.vec, m.unknownDomain, m.requests.vec, m.requestDuration,
		m.storeDuration, m.storeErrors, m.fallbackActive, m.breakerState, m.reloads.total, m.reloads.lastOK,
		m.lastReloadTime, m.rules); err != nil {
		return nil, err
	}
	m.BreakerState("closed")
	return m, nil
}

// register registers every collector on the registry, stopping at the first
// error.
func (m *Metrics) register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.registerer.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Decision counts one decision.
func (m *Metrics) Decision(domain, rule, limit, decision, source string) {
	m.decisions.get(decisionLabels{domain, rule, limit, decision, source}).Inc()
}

// NearLimit counts one admitted decision that left the client close to its
// limit.
func (m *Metrics) NearLimit(domain, rule, limit string) {
	m.nearLimit.get(nearLimitLabels{domain, rule, limit}).Inc()
}

// UnknownDomain counts one request for a domain that is not configured.
func (m *Metrics) UnknownDomain() { m.unknownDomain.Inc() }

// Request records one ShouldRateLimit call: its response code and duration.
func (m *Metrics) Request(code string, d time.Duration) {
	m.requests.get(codeLabel(code)).Inc()
	m.requestDuration.Observe(d.Seconds())
}

// FallbackActive records a fail-soft transition.
func (m *Metrics) FallbackActive(active bool) {
	if active {
		m.fallbackActive.Set(1)
	} else {
		m.fallbackActive.Set(0)
	}
}

// BreakerState records a circuit breaker transition.
func (m *Metrics) BreakerState(state string) {
	for _, s := range breakerStates {
		v := 0.0
		if s == state {
			v = 1
		}
		m.breakerState.WithLabelValues(s).Set(v)
	}
}

// StoreError counts one failed store call by kind.
func (m *Metrics) StoreError(kind string) { m.storeErrors.WithLabelValues(kind).Inc() }

// Reloaded records a configuration load: initial is true for the load at
// start (which sets the gauges but is not counted as a reload), rules maps
// each domain to its number of rules (nil when the load failed). It is
// called by one goroutine at a time (the configuration watcher's).
func (m *Metrics) Reloaded(initial, ok bool, at time.Time, rules map[string]int) {
	m.reloads.record(initial, ok)
	if ok {
		m.lastReloadTime.Set(float64(at.UnixNano()) / 1e9)
		// Set, then drop the domains gone: a scrape meanwhile sees every
		// domain that stays (after a Reset it could see none).
		for d, n := range rules {
			m.rules.WithLabelValues(d).Set(float64(n))
		}
		for d := range m.ruleDomains {
			if _, still := rules[d]; !still {
				m.rules.DeleteLabelValues(d)
			}
		}
		m.ruleDomains = maps.Clone(rules)
	}
}

// ConfigRestored records that the configuration folder holds the running
// configuration again after a reload failed (the bad edit was reverted):
// the failure is over, and nothing was reloaded.
func (m *Metrics) ConfigRestored() { m.reloads.restored() }

// reloads are the two families of something loaded again when it changes,
// the last good one kept when a load fails: the configuration folder, the
// gRPC listener's TLS files.
type reloads struct {
	total  *prometheus.CounterVec // loads after the first, by result
	lastOK prometheus.Gauge       // 0 while the last load failed
}

func newReloads(total prometheus.CounterOpts, lastOK prometheus.GaugeOpts) reloads {
	return reloads{
		total:  prometheus.NewCounterVec(total, []string{"result"}),
		lastOK: prometheus.NewGauge(lastOK),
	}
}

// record records a load; the first (initial) sets the gauge but is not
// counted.
func (r reloads) record(initial, ok bool) {
	result := "failure"
	if ok {
		result = "success"
		r.lastOK.Set(1)
	} else {
		r.lastOK.Set(0)
	}
	if !initial {
		r.total.WithLabelValues(result).Inc()
	}
}

// restored records that what is loaded is again what is served, after a
// failed load: the failure is over, and nothing was loaded.
func (r reloads) restored() { r.lastOK.Set(1) }

// InstancesFunc exports envoy_rls_instances, read from f at scrape time.
func (m *Metrics) InstancesFunc(f func() int) error {
	return m.registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "envoy_rls_instances",
		Help: "Live envoy-rls instances sharing the store, learned through heartbeats (or --fallback.instances); the fallback decides at 1/N of each limit.",
	}, func() float64 { return float64(f()) }))
}

// DenyCacheStats are the counters of the deny cache at one instant.
type DenyCacheStats struct {
	Answered, Forwarded, Skipped uint64
	Entries                      int
}

// DenyCache exports the deny cache's counters, read from stats at scrape
// time.
func (m *Metrics) DenyCache(stats func() DenyCacheStats) error {
	return m.register(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_deny_cache_answered_total",
			Help: "Requests answered OVER_LIMIT from the deny cache without a Redis call (every limit of the request was known to be denied until a later instant).",
		}, func() float64 { return float64(stats().Answered) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_deny_cache_forwarded_total",
			Help: "Requests the deny cache passed on to the store.",
		}, func() float64 { return float64(stats().Forwarded) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_deny_cache_skipped_total",
			Help: "Denials not remembered because the cache was full of live entries (raise --deny-cache.max-entries if this grows).",
		}, func() float64 { return float64(stats().Skipped) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "envoy_rls_deny_cache_entries",
			Help: "Counters currently remembered as denied.",
		}, func() float64 { return float64(stats().Entries) }),
	)
}

// RedisCallStats are the Redis backend's counters at one instant.
type RedisCallStats struct {
	Checks, Calls, SpareCalls uint64
	RefundErrors              uint64
	TryAgainRetries           uint64
}

// RedisCalls exports the Redis backend's counters of checks and script
// calls, read from stats at scrape time.
func (m *Metrics) RedisCalls(stats func() RedisCallStats) error {
	return m.register(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_redis_checks_total",
			Help: "Requests (their limits together) sent to Redis to be decided.",
		}, func() float64 { return float64(stats().Checks) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_redis_calls_total",
			Help: "Check script calls sent to Redis: one per request without coalescing (one per hash slot on a Cluster); with coalescing (--redis.senders) one call carries the requests that arrived while the others were in flight, and checks_total/calls_total is the average number per call.",
		}, func() float64 { return float64(stats().Calls) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_redis_spare_calls_total",
			Help: "Coalesced calls started while another was in flight. With --redis.spare-after, only once every call in flight had taken that long: a sign of slow or stalled Redis calls; at 0, every call that overlapped another.",
		}, func() float64 { return float64(stats().SpareCalls) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_redis_refund_errors_total",
			Help: "Cluster refunds that failed: a request one hash slot denied (or that failed on one) keeps the hits another slot counted until its window ends. Never an over-admission.",
		}, func() float64 { return float64(stats().RefundErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "envoy_rls_redis_tryagain_retries_total",
			Help: "Script calls sent again because Redis Cluster refused them with TRYAGAIN (their keys split between two masters while a hash slot migrated; nothing ran): a resharding in progress.",
		}, func() float64 { return float64(stats().TryAgainRetries) }),
	)
}

// InstrumentStore returns a limiter.Limiter that times every call of l in
// envoy_rls_store_duration_seconds. When l can also be given a deadline
// apart from its context (CheckBy, as redisbackend.Backend can), so can the
// limiter returned, so that the fail-soft layer above it sees that.
func (m *Metrics) InstrumentStore(l limiter.Limiter, now func() time.Time) limiter.Limiter {
	if now == nil {
		now = time.Now
	}
	t := &timedLimiter{next: l, m: m, now: now}
	if by, ok := l.(deadlineChecker); ok {
		return &timedDeadlineLimiter{timedLimiter: t, next: by}
	}
	return t
}

// deadlineChecker is a store that can be given a deadline apart from its
// context (failsoft.DeadlineChecker).
type deadlineChecker interface {
	CheckBy(ctx context.Context, by time.Time, reqs []limiter.Request, results []limiter.Result) error
}

type timedLimiter struct {
	next limiter.Limiter
	m    *Metrics
	now  func() time.Time
}

func (t *timedLimiter) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	start := t.now()
	err := t.next.Check(ctx, reqs, results)
	t.m.storeDuration.Observe(t.now().Sub(start).Seconds())
	return err
}

// timedDeadlineLimiter is a timedLimiter over a deadlineChecker.
type timedDeadlineLimiter struct {
	*timedLimiter
	next deadlineChecker
}

func (t *timedDeadlineLimiter) CheckBy(ctx context.Context, by time.Time, reqs []limiter.Request, results []limiter.Result) error {
	start := t.now()
	err := t.next.CheckBy(ctx, by, reqs, results)
	t.m.storeDuration.Observe(t.now().Sub(start).Seconds())
	return err
}

// TLSFiles records the loads of one set of TLS files: a server's
// certificate, key and client authorities, or a client's. Create it with
// Metrics.ListenerTLS or Metrics.RedisTLS.
type TLSFiles struct {
	reloads  reloads
	notAfter prometheus.Gauge // nil without a certificate
}

// Loaded records one load of the TLS files: initial is true for the load at
// start (which sets the gauges but is not counted as a reload); notAfter is
// the expiry of the certificate in use after it.
func (t *TLSFiles) Loaded(initial, ok bool, notAfter time.Time) {
	t.reloads.record(initial, ok)
	if t.notAfter != nil {
		t.notAfter.Set(float64(notAfter.Unix()))
	}
}

// Restored records that the TLS files hold the set in use again after a
// set that failed to load: the failure is over, and nothing was reloaded.
func (t *TLSFiles) Restored() { t.reloads.restored() }

// ListenerTLS records the TLS of the gRPC listener. Create it with
// Metrics.ListenerTLS, only when the listener serves TLS.
type ListenerTLS struct {
	TLSFiles
	handshakeFailures prometheus.Counter
}

// ListenerTLS registers the metrics of the gRPC listener's TLS.
func (m *Metrics) ListenerTLS() (*ListenerTLS, error) {
	t := &ListenerTLS{
		TLSFiles: TLSFiles{
			reloads: newReloads(
				prometheus.CounterOpts{
					Name: "envoy_rls_grpc_tls_reloads_total",
					Help: "Loads of the gRPC listener's certificate, key and client authorities after the first, by result (success, failure): they are read again when a handshake finds the files changed. After a failure the previous ones are still served.",
				},
				prometheus.GaugeOpts{
					Name: "envoy_rls_grpc_tls_last_reload_successful",
					Help: "0 while the gRPC listener's TLS files hold a set that failed to load (the previous certificate is still served); 1 once a good set loads or the files are reverted to the served one.",
				}),
			notAfter: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "envoy_rls_grpc_tls_certificate_expiry_timestamp_seconds",
				Help: "Unix time at which the certificate the gRPC listener serves expires (its NotAfter).",
			}),
		},
		handshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "envoy_rls_grpc_tls_handshake_failures_total",
			Help: "Connections to the gRPC listener closed because their TLS handshake failed: a client that does not trust the certificate, presents none or one that is refused, or does not speak TLS. Each is logged with the client's address. A connection closed without a word (EOF: a TCP probe) is not counted.",
		}),
	}
	if err := m.register(t.reloads.total, t.reloads.lastOK, t.notAfter, t.handshakeFailures); err != nil {
		return nil, err
	}
	return t, nil
}

// RedisTLS registers the metrics of the TLS files envoy-rls dials Redis
// with; withCert when they include a client certificate, whose expiry is
// then exported.
func (m *Metrics) RedisTLS(withCert bool) (*TLSFiles, error) {
	t := &TLSFiles{
		reloads: newReloads(
			prometheus.CounterOpts{
				Name: "envoy_rls_redis_tls_reloads_total",
				Help: "Loads of the Redis client's TLS files (authorities, client certificate and key) after the first, by result (success, failure): they are read again when a new connection to Redis finds them changed. After a failure the previous ones are still used.",
			},
			prometheus.GaugeOpts{
				Name: "envoy_rls_redis_tls_last_reload_successful",
				Help: "0 while the Redis client's TLS files hold a set that failed to load (new connections still use the previous one); 1 once a good set loads or the files are reverted to the one in use.",
			}),
	}
	collectors := []prometheus.Collector{t.reloads.total, t.reloads.lastOK}
	if withCert {
		t.notAfter = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "envoy_rls_redis_tls_client_certificate_expiry_timestamp_seconds",
			Help: "Unix time at which the client certificate presented to Redis expires (its NotAfter).",
		})
		collectors = append(collectors, t.notAfter)
	}
	if err := m.register(collectors...); err != nil {
		return nil, err
	}
	return t, nil
}

// HandshakeFailed counts one failed TLS handshake.
func (t *ListenerTLS) HandshakeFailed() { t.handshakeFailures.Inc() }
