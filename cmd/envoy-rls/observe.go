package main

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
)

// rlsObserver feeds the service's decisions into the metrics.
type rlsObserver struct {
	m *metrics.Metrics
	// nearLimit is the used fraction of a limit from which an admitted
	// decision counts as near the limit; 0 or less turns it off.
	nearLimit float64
}

func (o rlsObserver) ObserveDecision(d rls.Decision) {
	source := ""
	switch d.Outcome {
	case rls.OutcomeOK, rls.OutcomeOverLimit, rls.OutcomeShadowOverLimit:
		source = d.Source.String()
	}
	o.m.Decision(d.Domain, d.Rule, d.Limit, d.Outcome.String(), source)
	if d.Outcome == rls.OutcomeOK && o.nearLimit > 0 && d.Capacity > 0 &&
		float64(d.Capacity-min(d.Remaining, d.Capacity)) >= o.nearLimit*float64(d.Capacity) {
		o.m.NearLimit(d.Domain, d.Rule, d.Limit)
	}
}

func (o rlsObserver) UnknownDomain(string) { o.m.UnknownDomain() }

// requestMetrics times every ShouldRateLimit call and counts it by its
// overall code or gRPC error code.
func requestMetrics(m *metrics.Metrics, now func() time.Time) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			return handler(ctx, req)
		}
		start := now()
		resp, err := handler(ctx, req)
		code := "OK"
		if err != nil {
			code = status.Code(err).String()
		} else if r, ok := resp.(*rlsv3.RateLimitResponse); ok {
			code = r.OverallCode.String()
		}
		m.Request(code, now().Sub(start))
		return resp, err
	}
}

// recordReload turns a watcher event into metrics; the load at start sets
// the gauges but is not counted as a reload.
func recordReload(m *metrics.Metrics, ev descriptors.ReloadEvent) {
	initial := ev.Trigger == descriptors.TriggerInitial
	switch ev.Outcome {
	case descriptors.Loaded:
		rules := map[string]int{}
		for _, d := range ev.Config.Domains() {
			rules[d.Domain] = d.Rules
		}
		m.Reloaded(initial, true, ev.Time, rules)
	case descriptors.Failed:
		m.Reloaded(initial, false, ev.Time, nil)
	case descriptors.Restored:
		m.ConfigRestored()
	}
}
