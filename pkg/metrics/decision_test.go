package metrics_test

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// TestCountersFromManyGoroutines: decisions, near-limit counts and requests
// counted from many goroutines at once, on series they share and on series
// of their own, add up exactly in every series, and the families hold no
// series that was not counted (the children are looked up through a cache,
// which must hand every caller the family's one child).
func TestCountersFromManyGoroutines(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			own := fmt.Sprintf("rule%d", g)
			for range each {
				m.Decision("d", "shared", "per_ip", "ok", "store")
				m.Decision("d", own, "", "over_limit", "fallback")
				m.NearLimit("d", "shared", "per_ip")
				m.Request("OK", 0)
				m.Request("OVER_LIMIT", 0)
			}
		})
	}
	wg.Wait()

	want := map[string]float64{"decision=ok,domain=d,limit=per_ip,rule=shared,source=store": goroutines * each}
	for g := range goroutines {
		want[fmt.Sprintf("decision=over_limit,domain=d,limit=,rule=rule%d,source=fallback", g)] = each
	}
	for name, want := range map[string]map[string]float64{
		"envoy_rls_decisions_total":  want,
		"envoy_rls_near_limit_total": {"domain=d,limit=per_ip,rule=shared": goroutines * each},
		"envoy_rls_requests_total":   {"code=OK": goroutines * each, "code=OVER_LIMIT": goroutines * each},
	} {
		if got := counterSeries(t, reg, name); !maps.Equal(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", name, got, want)
		}
	}
}

// counterSeries returns the values of the counter family name by its series'
// labels ("k=v,k=v", in the registry's order: by name).
func counterSeries(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			var kv []string
			for _, l := range s.GetLabel() {
				kv = append(kv, l.GetName()+"="+l.GetValue())
			}
			got[strings.Join(kv, ",")] = s.GetCounter().GetValue()
		}
	}
	return got
}

// BenchmarkDecision is the cost of counting one decision on a series that
// exists, as every decision after a rule's first does, from parallel
// callers.
func BenchmarkDecision(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decision("bench", "per_ip", "per_second", "ok", "store")
		}
	})
}
