package redisbackend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestSentinelFailover: the master is stopped while Checks run; the same
// Backend follows the failover to the new master. Checks during the failover
// may fail, but only with ErrUnavailable; afterwards they succeed and count
// on the new master.
func TestSentinelFailover(t *testing.T) {
	s := testenv.RedisSentinel(t)
	b, err := New(Options{SentinelAddrs: s.SentinelAddrs, SentinelMaster: s.MasterName, Timeout: time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	ctx := context.Background()
	req := limiter.Request{Key: key(t.Name()), Limit: limiter.Limit{Requests: 1 << 20, Window: time.Hour}, Hits: 1}
	check := func() error { return b.Check(ctx, []limiter.Request{req}, make([]limiter.Result, 1)) }
	if err := check(); err != nil {
		t.Fatalf("Check before failover: %v", err)
	}

	// Run Checks throughout the failover.
	var ok, unavailable atomic.Int64
	var other sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			switch err := check(); {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, limiter.ErrUnavailable):
				unavailable.Add(1)
			default:
				other.Store(err.Error(), true)
			}
		}
	})

	s.Master.Stop()
	fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	newMaster, err := s.WaitFailover(fctx)
	cancel()
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("failover: %v", err)
	}
	if err := waitFor(check); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("no successful Check after the failover to %s: %v", newMaster, err)
	}
	for i := 0; i < 20; i++ {
		if err := check(); err != nil {
			t.Errorf("Check %d after the failover: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	other.Range(func(k, _ any) bool {
		t.Errorf("Check failed without ErrUnavailable: %v", k)
		return true
	})
	t.Logf("during the failover: %d ok, %d unavailable", ok.Load(), unavailable.Load())

	n := s.Node(newMaster)
	keys, err := n.Client().Keys(ctx, DefaultKeyPrefix+"*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys on the new master %s = %v, %v; want the one counter", newMaster, keys, err)
	}
	raw, err := n.Client().Get(ctx, keys[0]).Result()
	st, decoded := storedState(raw)
	if err != nil || !decoded || st[1]+st[2] < 21 {
		t.Errorf("counter on the new master = %q (%v, %v); want at least the 21 Checks after the failover", raw, st, err)
	}
}
