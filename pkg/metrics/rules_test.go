package metrics_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// TestRulesGaugeNeverEmpty: a scrape during a reload sees every domain that
// stays in the configuration, and a domain gone is dropped. The family was
// Reset and refilled, so a scrape in between could see no domain at all (a
// review's finding).
func TestRulesGaugeNeverEmpty(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	series := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Error(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() == "envoy_rls_config_rules" {
				for _, c := range mf.GetMetric() {
					out[c.GetLabel()[0].GetValue()] = c.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	m.Reloaded(true, true, time.Now(), map[string]int{"edge": 3})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rules := map[string]int{"edge": 3}
			if i%2 == 0 {
				rules["internal"] = 1
			}
			m.Reloaded(false, true, time.Now(), rules)
		}
	})
	for range 2000 {
		if got := series(); got["edge"] != 3 {
			t.Errorf("a scrape during reloads: %v, want edge at 3", got)
			break
		}
	}
	close(stop)
	wg.Wait()
	m.Reloaded(false, true, time.Now(), map[string]int{"edge": 2})
	if got := series(); len(got) != 1 || got["edge"] != 2 {
		t.Errorf("after a load of edge alone: %v, want edge at 2 and no other domain", got)
	}
	m.Reloaded(false, false, time.Now(), nil)
	if got := series(); len(got) != 1 || got["edge"] != 2 {
		t.Errorf("after a failed load: %v, want the last good load's", got)
	}
}
