package limitertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// HammerOptions configures Hammer. Zero fields take the documented defaults.
type HammerOptions struct {
	// Algorithm of every Request (default SlidingWindow, the zero value).
	Algorithm limiter.Algorithm
	// Goroutines per Limiter instance (default 16).
	Goroutines int
	// Limit is L of the binding counter (default 50).
	Limit uint64
	// Burst of a token bucket (default 0: Limit).
	Burst uint64
	// Window is W (default 1s).
	Window time.Duration
	// Windows is the number of rounds, one window apart (default 3).
	Windows int
	// PerBatch is the number of Requests per Check (default 1). Request i
	// of a batch counts on key i%2, so with 3 the binding key is hit twice
	// per batch and a second key (limit 2L) once.
	PerBatch int
	// Key prefixes the counters' keys (default t.Name()).
	Key string
}

func (o *HammerOptions) defaults(t *testing.T) {
	if o.Goroutines <= 0 {
		o.Goroutines = 16
	}
	if o.Limit == 0 {
		o.Limit = 50
	}
	if o.Window <= 0 {
		o.Window = time.Second
	}
	if o.Windows <= 0 {
		o.Windows = 3
	}
	if o.PerBatch <= 0 {
		o.PerBatch = 1
	}
	if o.Key == "" {
		o.Key = t.Name()
	}
}

// Hammer runs o.Goroutines goroutines on each of limiters (instances that
// share one store, all reading clock) against the same counters. In each of
// o.Windows rounds the clock stands still at one instant, every goroutine
// sends enough batches that together they exceed the capacity, and Hammer
// checks that the number of admitted batches equals exactly what the
// reference model admits for the same number of batches at that instant (at
// a fixed instant the outcome does not depend on the interleaving), and
// that the counters hold exactly the model's state afterwards. Between
// rounds the clock moves one window on. Hammer moves clock itself,
// starting at the next window boundary after its current time plus W/2.
func Hammer(t *testing.T, limiters []limiter.Limiter, clock *Clock, o HammerOptions) {
	t.Helper()
	o.defaults(t)
	if len(limiters) == 0 {
		t.Fatal("Hammer: no limiters")
	}
	lim := limiter.Limit{Algorithm: o.Algorithm, Requests: o.Limit, Window: o.Window, Burst: o.Burst}
	second := lim
	second.Requests = 2 * o.Limit
	if second.Burst > 0 {
		second.Burst = 2 * o.Burst
	}
	batch := make([]limiter.Request, o.PerBatch)
	for i := range batch {
		batch[i] = limiter.Request{Key: fmt.Sprintf("%s/hammer/%d", o.Key, i%2), Limit: lim, Hits: 1}
		if i%2 == 1 {
			batch[i].Limit = second
		}
	}
	probe := make([]limiter.Request, len(batch))
	for i := range batch {
		probe[i] = batch[i]
		probe[i].Hits = 0
	}
	total := len(limiters) * o.Goroutines
	perG := int(2*lim.Capacity()+2)/total + 1
	w := o.Window.Milliseconds()
	base := (clock.Millis()/w+1)*w + w/2
	m := NewModel()
	ctx := context.Background()
	for round := range o.Windows {
		now := base + int64(round)*w
		clock.SetMillis(now)
		want := 0
		for range total * perG {
			if _, ok := m.Check(now, batch, false); ok {
				want++
			}
		}
		var admitted atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, l := range limiters {
			for range o.Goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := make([]limiter.Result, len(batch))
					<-start
					for range perG {
						if err := l.Check(ctx, batch, res); err != nil {
							t.Errorf("round %d: Check: %v", round, err)
							return
						}
						all := true
						for _, r := range res {
							all = all && r.Allowed
						}
						if all {
							admitted.Add(1)
						}
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		if got := int(admitted.Load()); got != want {
			t.Errorf("%v round %d at %d: %d goroutines × %d batches of %d admitted %d batches, model admits %d",
				o.Algorithm, round, now, total, perG, len(batch), got, want)
		}
		got := make([]limiter.Result, len(probe))
		if err := limiters[0].Check(ctx, probe, got); err != nil {
			t.Fatalf("round %d: probe: %v", round, err)
		}
		wantP, _ := m.Check(now, probe, false)
		for i := range got {
			if got[i] != wantP[i] {
				t.Errorf("%v round %d: state after the round: probe %d = %+v, model %+v", o.Algorithm, round, i, got[i], wantP[i])
			}
		}
	}
}

// HammerAll runs Hammer as subtests for every algorithm with 1 and 3
// Requests per batch, with goroutines goroutines per instance.
func HammerAll(t *testing.T, limiters []limiter.Limiter, clock *Clock, goroutines int) {
	for _, alg := range algorithms {
		for _, per := range []int{1, 3} {
			t.Run(fmt.Sprintf("%v/batch%d", alg, per), func(t *testing.T) {
				Hammer(t, limiters, clock, HammerOptions{Algorithm: alg, Goroutines: goroutines, PerBatch: per})
			})
		}
	}
}
