package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads every envoy_rls_* family from the running server's /metrics.
func scrape(t *testing.T, r *running) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + r.addrs.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// scrapeUntil scrapes r until the series name{labels} reads want (the
// reload a SIGHUP starts reports nothing else to wait on), at most 10,000
// times, and returns that scrape.
func scrapeUntil(t *testing.T, r *running, name string, want float64, labels ...string) map[string]*dto.MetricFamily {
	t.Helper()
	for range 10_000 {
		fams := scrape(t, r)
		if v, _ := value(fams, name, labels...); v == want {
			return fams
		}
	}
	t.Fatalf("%s%v never read %v", name, labels, want)
	return nil
}

// value returns the value of the series of family name whose labels
// include every pair of labels, and whether it exists.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func series(fams map[string]*dto.MetricFamily) int {
	n := 0
	for name, f := range fams {
		if len(name) > 10 && name[:10] == "envoy_rls_" {
			n += len(f.Metric)
		}
	}
	return n
}

func TestMetricsFollowScriptedRequests(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "m.yaml")
	good := `
domain: m
descriptors:
  - key: ip
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {name: shadowed, unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: near
    rate_limit: {name: near, unit: hour, requests_per_unit: 10}
`
	writeFile(t, file, good)
	r := startServe(t, serveOptions{configDir: dir, nearLimit: 0.8})
	call := func(domain string, d ...*commonrl.RateLimitDescriptor) {
		t.Helper()
		if _, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: d}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 { // 2 ok, 1 over_limit
		call("m", desc("ip", "1.2.3.4"))
	}
	for range 2 { // 1 ok, 1 shadow_over_limit
		call("m", desc("shadow", "x"))
	}
	call("m", desc("free", "x"))
	for range 10 { // used 1..10 of 10: the 8th, 9th and 10th are at or above 0.8
		call("m", desc("near", "x"))
	}
	call("m", desc("nothing", "x"))
	call("nowhere", desc("ip", "1.2.3.4"))
	_, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: ""})
	if err == nil {
		t.Fatal("empty domain accepted")
	}

	fams := scrape(t, r)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"envoy_rls_decisions_total", []string{"domain", "m", "limit", "per_ip", "decision", "ok", "source", "store"}, 2},
		{"envoy_rls_decisions_total", []string{"domain", "m", "limit", "per_ip", "decision", "over_limit", "source", "store"}, 1},
		{"envoy_rls_decisions_total", []string{"domain", "m", "limit", "shadowed", "decision", "ok"}, 1},
		{"envoy_rls_decisions_total", []string{"domain", "m", "limit", "shadowed", "decision", "shadow_over_limit"}, 1},
		{"envoy_rls_decisions_total", []string{"domain", "m", "decision", "unlimited"}, 1},
		{"envoy_rls_decisions_total", []string{"domain", "m", "decision", "no_rule"}, 1},
		{"envoy_rls_unknown_domain_requests_total", nil, 1},
		{"envoy_rls_near_limit_total", []string{"domain", "m", "limit", "near"}, 3},
		{"envoy_rls_near_limit_total", []string{"domain", "m", "limit", "per_ip"}, 1}, // 1 of 2 is 0.5; 2 of 2 counts
		{"envoy_rls_requests_total", []string{"code", "OK"}, 17},
		{"envoy_rls_requests_total", []string{"code", "OVER_LIMIT"}, 1},
		{"envoy_rls_requests_total", []string{"code", "InvalidArgument"}, 1},
		{"envoy_rls_request_duration_seconds", nil, 19},
		{"envoy_rls_config_rules", []string{"domain", "m"}, 4},
		{"envoy_rls_config_last_reload_successful", nil, 1},
		{"envoy_rls_fallback_active", nil, 0},
		{"envoy_rls_circuit_breaker_state", []string{"state", "closed"}, 1},
	} {
		got, ok := value(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := value(fams, "envoy_rls_config_reloads_total"); ok {
		t.Error("the load at start was counted as a reload")
	}

	// A broken reload keeps the config and moves the reload metrics.
	writeFile(t, file, "domain: m\ndescriptors: [{key: }]\n")
	r.hup <- nil
	fams = scrapeUntil(t, r, "envoy_rls_config_reloads_total", 1, "result", "failure")
	if v, _ := value(fams, "envoy_rls_config_last_reload_successful"); v != 0 {
		t.Errorf("last_reload_successful = %v after a failed reload", v)
	}
	call("m", desc("ip", "5.6.7.8")) // still served by the last good config
	fams = scrape(t, r)
	if v, _ := value(fams, "envoy_rls_decisions_total", "limit", "per_ip", "decision", "ok"); v != 3 {
		t.Errorf("per_ip ok = %v after the failed reload, want 3", v)
	}

	// Reverting the bad edit ends the failure: the folder holds the running
	// configuration again (nothing is reloaded or counted).
	writeFile(t, file, good)
	r.hup <- nil
	fams = scrapeUntil(t, r, "envoy_rls_config_last_reload_successful", 1)
	if v, _ := value(fams, "envoy_rls_config_reloads_total", "result", "success"); v != 0 {
		t.Errorf("the revert was counted as %v successful reloads, want 0", v)
	}
}

func TestDistinctValuesAddNoSeries(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "m.yaml"), "domain: m\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n")
	r := startServe(t, serveOptions{configDir: dir})
	call := func(i int) {
		if _, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "m", Descriptors: []*commonrl.RateLimitDescriptor{desc("ip", fmt.Sprintf("10.0.%d.%d", i/256, i%256)), desc("other", fmt.Sprint(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	call(0)
	before := series(scrape(t, r))
	for i := 1; i < 10000; i++ {
		call(i)
	}
	if after := series(scrape(t, r)); after != before {
		t.Errorf("10,000 distinct descriptor values changed the envoy_rls_* series from %d to %d", before, after)
	}
}
