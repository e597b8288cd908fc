// Package rls is the gRPC face of envoy-rls: Envoy's
// envoy.service.ratelimit.v3.RateLimitService. It validates a
// RateLimitRequest, matches every request descriptor against the current
// descriptor configuration, turns the matched limits into one batched
// limiter.Check call, and builds the RateLimitResponse: the overall code, one
// status per request descriptor, response headers (IETF RateLimit fields by
// default), an RFC 9457 problem+json body on OVER_LIMIT, and dynamic metadata
// naming the rule that decided.
//
// It is the only package that knows the Envoy protos. See DESIGN.md §2, §7
// and §8 for the path of a request and what Envoy gets back; the decisions
// this package makes where Envoy and the incumbent (envoyproxy/ratelimit) are
// silent are written down next to the code that makes them:
//
//   - RequestLimits: the bounds on request size, and their defaults.
//   - Service.ShouldRateLimit: hits, the per-descriptor limit override,
//     replaces, shadow mode, and the choice of the "most restrictive" limit.
//   - HeaderMode: the response header formats, with examples.
//   - reportedUnit: how arbitrary windows are reported in current_limit.
//
// A Service is safe for concurrent use.
package rls
