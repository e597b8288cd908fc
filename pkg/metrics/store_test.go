package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// TestInstrumentStoreKeepsCheckBy: the store timing wrapper that serve puts
// between the fail-soft layer and the Redis backend keeps the backend's
// CheckBy (so that the fail-soft layer derives no context per request), and
// times calls made through it as it times Check; over a store without
// CheckBy it has none.
func TestInstrumentStoreKeepsCheckBy(t *testing.T) {
	r := testenv.RedisServer(t)
	rb, err := redisbackend.New(redisbackend.Options{URL: "redis://" + r.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rb.Close() })
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}

	by, ok := m.InstrumentStore(rb, nil).(failsoft.DeadlineChecker)
	if !ok {
		t.Fatal("InstrumentStore over a redisbackend.Backend has no CheckBy")
	}
	reqs := []limiter.Request{{Key: t.Name(), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}}
	res := make([]limiter.Result, 1)
	for range 2 {
		if err := by.CheckBy(context.Background(), time.Now().Add(20*time.Second), reqs, res); err != nil {
			t.Fatalf("CheckBy: %v", err)
		}
	}
	if !res[0].Allowed || res[0].Remaining != 8 {
		t.Errorf("second CheckBy: %+v, want allowed with 8 remaining", res[0])
	}
	if n := storeObservations(t, reg); n != 2 {
		t.Errorf("envoy_rls_store_duration_seconds counted %d calls, want 2", n)
	}

	mem := memorybackend.New(memorybackend.Options{})
	t.Cleanup(func() { mem.Close() })
	if _, ok := m.InstrumentStore(mem, nil).(failsoft.DeadlineChecker); ok {
		t.Error("InstrumentStore over a store without CheckBy has one")
	}
}

// storeObservations returns the sample count of
// envoy_rls_store_duration_seconds.
func storeObservations(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "envoy_rls_store_duration_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no envoy_rls_store_duration_seconds")
	return 0
}
