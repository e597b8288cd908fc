package redisbackend

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// BenchmarkCheckBehindLatency offers Checks at a fixed rate (one every
// 200 µs, 5,000/s, each in a goroutine of its own: an open loop, as many
// gateways' traffic is) to a Backend whose Redis answers 3 ms late (a Redis
// across a network), and reports the share of Checks that failed
// ("%failed": a Check that failed is answered by its rule's failure mode),
// how many Checks a coalesced call carried, and the Checks' latency from
// their intended start (p50-ms, p99-ms: no coordinated omission). Every
// Check has a deadline of 25 ms (Envoy's timeout), or, in
// budgets=25ms+100ms, every other one 100 ms (two gateways with different
// timeouts, whose Checks coalesce apart). The default is two sender slots;
// senders=1 and senders=4 change that, spare-after=250us and
// spare-after=1ms set Options.SpareAfter. With calls of at least 3 ms, the calls keep up only
// if each carries what arrived during the one before: a coalescer that kept
// Checks of one budget apart by their arrival fell behind until Checks
// expired in its queue. ns/op is the offered interval, not a speed. Run:
//
//	go test -tags vtprotobuf -run '^$' -bench CheckBehindLatency -benchtime 10000x ./pkg/redisbackend
func BenchmarkCheckBehindLatency(b *testing.B) {
	const short, long = 25 * time.Millisecond, 100 * time.Millisecond
	for _, c := range []struct {
		name string
		o    behindLatency
	}{
		{"budget=25ms", behindLatency{even: short, odd: short}},
		{"budgets=25ms+100ms", behindLatency{even: short, odd: long}},
		{"senders=1", behindLatency{even: short, odd: short, senders: 1}},
		{"senders=4", behindLatency{even: short, odd: short, senders: 4}},
		{"spare-after=250us", behindLatency{even: short, odd: short, spareAfter: 250 * time.Microsecond}},
		{"spare-after=1ms", behindLatency{even: short, odd: short, spareAfter: time.Millisecond}},
	} {
		b.Run(c.name, func(b *testing.B) { benchBehindLatency(b, c.o) })
	}
}

// behindLatency is one case of BenchmarkCheckBehindLatency: the deadlines
// of the even and odd Checks, and the Backend's Options.Senders and
// Options.SpareAfter (0: their defaults).
type behindLatency struct {
	even, odd  time.Duration
	senders    int
	spareAfter time.Duration
}

// benchBehindLatency runs one case of BenchmarkCheckBehindLatency.
func benchBehindLatency(b *testing.B, o behindLatency) {
	const (
		interval = 200 * time.Microsecond
		delay    = 3 * time.Millisecond
	)
	r := testenv.RedisServer(b)
	p := newDelayProxy(b, r.Addr, delay)
	be := openBackend(b, Options{URL: "redis://" + p.addr(), KeyPrefix: "lat:", Timeout: testTimeout, Senders: o.senders, SpareAfter: o.spareAfter})
	req := []limiter.Request{{Key: key("lat", "a"), Limit: limiter.Limit{Requests: 1 << 30, Window: time.Hour}, Hits: 1}}
	if err := be.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil { // load the library
		b.Fatal(err)
	}
	var failed atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var took []time.Duration // from each Check's intended start
	calls := be.CallStats().Calls
	b.ResetTimer()
	start := time.Now()
	i := 0
	for b.Loop() {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		budget := o.even
		if i%2 == 1 {
			budget = o.odd
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			res := make([]limiter.Result, 1)
			if err := be.Check(ctx, req, res); err != nil {
				failed.Add(1)
			}
			d := time.Since(at)
			mu.Lock()
			took = append(took, d)
			mu.Unlock()
		})
		i++
	}
	wg.Wait()
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(100*float64(failed.Load())/n, "%failed")
	if c := be.CallStats().Calls - calls; c > 0 {
		b.ReportMetric(n/float64(c), "checks/call")
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
}
