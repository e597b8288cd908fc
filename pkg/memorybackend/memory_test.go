package memorybackend

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

func TestConformance(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		b := New(Options{Now: now})
		t.Cleanup(func() { b.Close() })
		return b
	})
}

func TestHammer(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, Shards: 4})
	defer b.Close()
	// 64 goroutines on one store, spread over four handles of it.
	limitertest.HammerAll(t, []limiter.Limiter{b, b, b, b}, clock, 16)
}

// TestCounterKeepsOnlyItsKey: a request's keys are substrings of one
// string, and the map keeps its own copy of a counter's key, on insert and
// on every update (a map assignment replaces a string key), so that a
// counter does not keep every key of the request that last wrote it.
func TestCounterKeepsOnlyItsKey(t *testing.T) {
	b := New(Options{SweepInterval: -1})
	defer b.Close()
	l := limiter.Limit{Requests: 10, Window: time.Minute}
	within := func(s, in string) bool {
		p, lo := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(in)))
		return p >= lo && p < lo+uintptr(len(in))
	}
	var joined []string
	for i := range 3 { // an insert, then two updates
		all := strings.Repeat("x", 4096) + "counter" + strings.Repeat("y", 4096)
		joined = append(joined, all)
		req := []limiter.Request{{Key: all[4096 : 4096+len("counter")], Limit: l, Hits: 1}}
		if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for k := range b.shards {
			sh := &b.shards[k]
			sh.mu.Lock()
			for id, e := range sh.m {
				n++
				for _, s := range joined {
					if within(id.key, s) || within(e.key, s) {
						t.Errorf("Check %d: the counter's key %q is part of a request's string of %d bytes", i, id.key, len(s))
					}
				}
			}
			sh.mu.Unlock()
		}
		if n != 1 {
			t.Fatalf("Check %d: %d counters, want 1", i, n)
		}
	}
	runtime.KeepAlive(joined)

	// An update reuses the map's copy: no allocation per write.
	big := []limiter.Request{{Key: "roomy", Limit: limiter.Limit{Requests: 1 << 40, Window: time.Minute}, Hits: 1}}
	res := make([]limiter.Result, 1)
	if allocs := testing.AllocsPerRun(100, func() {
		if err := b.Check(context.Background(), big, res); err != nil || !res[0].Allowed {
			t.Fatalf("Check = %v, %+v", err, res[0])
		}
	}); allocs != 0 {
		t.Errorf("an update allocates %.1f times, want 0", allocs)
	}
}
