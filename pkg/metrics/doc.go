// Package metrics holds envoy-rls's Prometheus metrics: every family is
// named envoy_rls_*, registered on a registry passed in (never the global
// default), and labelled only with values bounded by the configuration
// (domain, rule and limit names, decision, source) or by the code (error
// kinds, breaker states) — never with descriptor values or client addresses.
//
// Metrics satisfies the observers that pkg/failsoft declares; cmd adapts
// pkg/rls's Observer to Decision. Every method is safe for concurrent use.
package metrics
