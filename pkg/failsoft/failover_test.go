package failsoft_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// storedCount returns how many hits the store holds for the workload's keys
// (keys per worker as started), read through the backend itself, waiting at
// most d for every key's master to answer.
func storedCount(t *testing.T, rb *redisbackend.Backend, keys int, d time.Duration) int64 {
	t.Helper()
	var reqs []limiter.Request
	for i := 0; i < workers; i++ {
		for _, k := range workKeys(i, keys) {
			reqs = append(reqs, limiter.Request{Key: k, Limit: workLimit})
		}
	}
	res := make([]limiter.Result, len(reqs))
	var err error
	if !poll(d, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err = rb.Check(ctx, reqs, res)
		return err == nil
	}) {
		t.Fatalf("read the counters back: %v", err)
	}
	var n int64
	for _, r := range res {
		n += int64(workLimit.Requests - r.Remaining)
	}
	return n
}

// failover runs the workload on fs while kill takes a master away and
// waitFailover waits for its replacement, and reports the hits the store had
// admitted and the hits it holds afterwards.
func failover(t *testing.T, fs *failsoft.Limiter, rec *recorder, rb *redisbackend.Backend, keys int, kill func(), waitFailover func()) {
	t.Helper()
	w := startWorkload(fs, keys)
	defer w.finish(t)
	if !poll(30*time.Second, func() bool { return w.sources[limiter.SourceStore].Load() > 200 }) {
		t.Fatalf("the store never decided before the failover (breaker %q)", fs.State())
	}
	kill()
	if !poll(30*time.Second, func() bool { return w.degraded() > 0 }) {
		t.Fatal("no answer by failure mode after the master was killed")
	}
	waitFailover()
	// Every key's master answers the backend again. (go-redis's Cluster
	// client only reloads the slot map on MOVED/READONLY or every
	// ClusterStateReloadInterval, 60 s by default, so this can take a
	// minute; until then the victim's keys are decided by failure mode.)
	storedCount(t, rb, keys, 120*time.Second)
	storeBefore := w.sources[limiter.SourceStore].Load()
	if !poll(60*time.Second, func() bool {
		return fs.State() == "closed" && w.sources[limiter.SourceStore].Load() > storeBefore+500
	}) {
		_, states, errs := rec.snapshot()
		t.Fatalf("decisions did not return to the store after the failover: breaker %v, errors %v", states, errs)
	}
	w.finish(t)
	_, states, errs := rec.snapshot()
	t.Logf("breaker states %v; store errors %v", states, errs)

	admitted := w.sources[limiter.SourceStore].Load()
	stored := storedCount(t, rb, keys, 30*time.Second)
	t.Logf("MEASURED: the store admitted %d hits, the new master holds %d: %d lost in the failover "+
		"(negative: hits of timed-out calls that were counted but answered by failure mode)",
		admitted, stored, admitted-stored)
	if stored == 0 || stored > admitted+w.degraded() {
		t.Errorf("the store holds %d hits, %d admitted by it and %d answered by failure mode", stored, admitted, w.degraded())
	}
}

func TestSentinelFailover(t *testing.T) {
	s := testenv.RedisSentinel(t)
	rb := newRedisBackend(t, redisbackend.Options{SentinelAddrs: s.SentinelAddrs, SentinelMaster: s.MasterName, PoolSize: poolSize})
	rec := newRecorder()
	logger, _ := newLogs(t)
	fs := newFailsoft(t, failsoft.Options{Primary: rb, Fallback: newMemory(t, nil), Observer: rec, Logger: logger})
	failover(t, fs, rec, rb, 1,
		func() { s.Master.Kill() },
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			addr, err := s.WaitFailover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("new master %s", addr)
		})
}

func TestClusterMasterLoss(t *testing.T) {
	c := testenv.RedisCluster(t, testenv.WithClusterReplicas(1))
	rb := newRedisBackend(t, redisbackend.Options{ClusterAddrs: c.Addrs, PoolSize: poolSize})
	rec := newRecorder()
	logger, _ := newLogs(t)
	fs := newFailsoft(t, failsoft.Options{Primary: rb, Fallback: newMemory(t, nil), Observer: rec, Logger: logger})
	victim := c.Masters[0]
	failover(t, fs, rec, rb, 8, // 48 keys: about a third on the victim
		func() { victim.Kill() },
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// The victim's replica takes its slots over once the
			// cluster marks it failed (cluster-node-timeout).
			replica := c.Replicas[0][0]
			if !poll(60*time.Second, func() bool {
				role, err := replica.Client().Do(ctx, "ROLE").Slice()
				return err == nil && len(role) > 0 && role[0] == "master"
			}) {
				t.Fatal("the victim's replica was not promoted")
			}
		})
}

// TestFallbackShareAcrossInstances: four instances learn through heartbeats
// on one Redis that they are four; Redis stops; one key hammered through all
// four is admitted about once in total, not four times.
func TestFallbackShareAcrossInstances(t *testing.T) {
	const n = 4
	lim := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 1003, Window: time.Minute}
	r := testenv.RedisServer(t)
	// The fallbacks decide at one fixed instant: the window cannot move
	// while the key is hammered.
	clock := limitertest.NewClock(time.UnixMilli(1_700_000_000_000))
	insts := make([]*failsoft.Limiter, n)
	recs := make([]*logs, n)
	for i := range insts {
		rb := newRedisBackend(t, redisbackend.Options{URL: "redis://" + r.Addr})
		logger, lg := newLogs(t)
		recs[i] = lg
		insts[i] = newFailsoft(t, failsoft.Options{
			Primary:           rb,
			Fallback:          newMemory(t, clock.Now),
			Heartbeat:         rb,
			HeartbeatInterval: 50 * time.Millisecond,
			InstanceID:        fmt.Sprintf("rls-%d", i),
			Logger:            logger,
		})
		startRun(t, insts[i])
	}
	if !poll(10*time.Second, func() bool {
		for _, l := range insts {
			if l.Instances() != n {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("instances did not learn they are %d: %d %d %d %d", n,
			insts[0].Instances(), insts[1].Instances(), insts[2].Instances(), insts[3].Instances())
	}

	r.Stop()
	// Every instance has failed a heartbeat and keeps the last known N.
	if !poll(10*time.Second, func() bool {
		for _, lg := range recs {
			if lg.count("heartbeat failed: keeping the last known number of instances") == 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("heartbeats did not fail after Redis stopped")
	}
	for i, l := range insts {
		if l.Instances() != n {
			t.Errorf("instance %d: Instances() = %d after Redis stopped, want the last known %d", i, l.Instances(), n)
		}
	}

	var admitted, checks atomic.Int64
	var wg sync.WaitGroup
	for _, l := range insts {
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := []limiter.Request{{Key: "hot", Limit: lim, Hits: 1}}
				res := make([]limiter.Result, 1)
				for k := uint64(0); k < lim.Requests; k++ {
					ctx, cancel := context.WithTimeout(context.Background(), envoyTimeout)
					err := l.Check(ctx, req, res)
					cancel()
					checks.Add(1)
					if err != nil {
						t.Errorf("Check: %v", err)
						return
					}
					if res[0].Source != limiter.SourceFallback {
						t.Errorf("Check with Redis stopped: source %v, want fallback", res[0].Source)
						return
					}
					if res[0].Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	want := int64(n) * int64(failsoft.Share(lim, n).Requests)
	t.Logf("MEASURED: %d instances admitted %d of %d checks on one key with limit %d (share %d each)",
		n, admitted.Load(), checks.Load(), lim.Requests, failsoft.Share(lim, n).Requests)
	if admitted.Load() != want || admitted.Load() > int64(lim.Requests) {
		t.Errorf("admitted %d in total, want %d instances × their share = %d, never above the limit %d",
			admitted.Load(), n, want, lim.Requests)
	}
}

// TestHeartbeatOverrideStillBeats: an instance with the instances override
// keeps its fixed N but still beats, so the others count it; when its Run
// stops, the others stop counting it.
func TestHeartbeatOverrideStillBeats(t *testing.T) {
	r := testenv.RedisServer(t)
	mk := func(id string, override int) *failsoft.Limiter {
		rb := newRedisBackend(t, redisbackend.Options{URL: "redis://" + r.Addr})
		return newFailsoft(t, failsoft.Options{Primary: rb, Fallback: newMemory(t, nil), Heartbeat: rb,
			HeartbeatInterval: 50 * time.Millisecond, InstanceID: id, Instances: override})
	}
	learner, fixed := mk("learner", 0), mk("fixed", 7)
	startRun(t, learner)
	stopFixed := startRun(t, fixed)
	if !poll(10*time.Second, func() bool { return learner.Instances() == 2 }) {
		t.Fatalf("learner counts %d instances, want 2 (the fixed one beats too)", learner.Instances())
	}
	if fixed.Instances() != 7 {
		t.Errorf("fixed instance: Instances() = %d, want the override 7", fixed.Instances())
	}
	stopFixed()
	if !poll(10*time.Second, func() bool { return learner.Instances() == 1 }) {
		t.Errorf("learner counts %d instances after the other stopped, want 1", learner.Instances())
	}
}

// startRun runs l.Run until the returned stop is called or the test ends;
// stop waits for Run to return and fails the test if it returned an error.
func startRun(t *testing.T, l *failsoft.Limiter) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
