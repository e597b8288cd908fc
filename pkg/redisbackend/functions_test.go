package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/redis/go-redis/v9"
)

// countdown checks one hit at a time against a limit of 100 per hour and
// fails the test unless every check is admitted with exactly one less
// remaining than the one before: whatever happens to the code on the server
// between checks, each check counts once.
type countdown struct {
	b    *Backend
	req  []limiter.Request
	res  []limiter.Result
	last uint64
}

func newCountdown(b *Backend, name string) *countdown {
	return &countdown{
		b:    b,
		req:  []limiter.Request{{Key: key("functions", name), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}},
		res:  make([]limiter.Result, 1),
		last: 100,
	}
}

func (c *countdown) check(t *testing.T, step string) {
	t.Helper()
	if err := c.b.Check(context.Background(), c.req, c.res); err != nil {
		t.Fatalf("%s: Check: %v", step, err)
	}
	if !c.res[0].Allowed || c.res[0].Remaining != c.last-1 {
		t.Fatalf("%s: allowed %v with %d remaining, want allowed with %d", step, c.res[0].Allowed, c.res[0].Remaining, c.last-1)
	}
	c.last = c.res[0].Remaining
}

// TestFunctionLibraryReloaded: when the server loses the library (FUNCTION
// FLUSH, or a restart without persistence) the next check loads it again
// and counts once.
func TestFunctionLibraryReloaded(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	c := newCountdown(b, "reload")
	c.check(t, "first check (loads the library)")
	if !b.UsesFunctions() {
		t.Fatal("UsesFunctions false on Redis 7")
	}
	ctx := context.Background()
	libs, err := r.Client().FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("FUNCTION LIST: %v, %d libraries; want the one envoy-rls loaded", err, len(libs))
	}
	for i := 0; i < 3; i++ {
		if err := r.Client().FunctionFlush(ctx).Err(); err != nil {
			t.Fatalf("FUNCTION FLUSH: %v", err)
		}
		c.check(t, "check after FUNCTION FLUSH")
		c.check(t, "second check after FUNCTION FLUSH")
	}
	if !b.UsesFunctions() {
		t.Error("UsesFunctions false after reloads")
	}
}

// TestFunctionLibraryReloadedCluster: the same on a Cluster, whose
// coalesced calls go out in pipelines: after FUNCTION FLUSH on every master,
// the call refused in the pipeline is sent again on its own, which loads the
// library on every master, and the check counts once. So does a Check
// spanning three masters.
func TestFunctionLibraryReloadedCluster(t *testing.T) {
	cl := testenv.RedisCluster(t)
	b := newClustered(t, cl, DefaultKeyPrefix, nil)
	c := newCountdown(b, "reload-cluster")
	l := limiter.Limit{Requests: 100, Window: time.Hour}
	spread := keysOnDistinctMasters(t, cl, l, 3)
	reqs := make([]limiter.Request, len(spread))
	for i, k := range spread {
		reqs[i] = limiter.Request{Key: k, Limit: l, Hits: 1}
	}
	res := make([]limiter.Result, len(reqs))
	ctx := context.Background()
	c.check(t, "first check (loads the library)")
	for round := 1; round <= 3; round++ {
		for _, n := range cl.Nodes() {
			if err := n.Client().FunctionFlush(ctx).Err(); err != nil {
				t.Fatalf("FUNCTION FLUSH on %s: %v", n.Addr, err)
			}
		}
		c.check(t, "check after FUNCTION FLUSH")
		if err := b.Check(ctx, reqs, res); err != nil {
			t.Fatalf("Check on three masters after FUNCTION FLUSH: %v", err)
		}
		for i, r := range res {
			if !r.Allowed || r.Remaining != uint64(100-round) {
				t.Fatalf("round %d, request %d on its own master: %+v, want allowed with %d remaining", round, i, r, 100-round)
			}
		}
	}
	if !b.UsesFunctions() {
		t.Error("UsesFunctions false after reloads")
	}
}

// TestFunctionsForbiddenFallsBackToScripts: an ACL user that may run scripts
// but not Functions gets checks served by EVALSHA, counted once each.
func TestFunctionsForbiddenFallsBackToScripts(t *testing.T) {
	r := testenv.RedisServer(t)
	ctx := context.Background()
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "rls", "on", ">secret", "~*", "+@all", "-fcall", "-fcall_ro", "-function").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	b, err := New(Options{URL: "redis://" + r.Addr, Username: "rls", Password: "secret", Timeout: testTimeout})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	c := newCountdown(b, "forbidden")
	c.check(t, "first check (FCALL refused)")
	if b.UsesFunctions() {
		t.Error("UsesFunctions true although FCALL is forbidden")
	}
	c.check(t, "second check")
}

// TestFunctionsWithoutFCALLSupport: a server on which FCALL is an unknown
// command (renamed away here, as on Redis before 7.0) is served with scripts.
func TestFunctionsWithoutFCALLSupport(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithArgs("--rename-command", "FCALL", ""))
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	c := newCountdown(b, "unknown")
	c.check(t, "first check (FCALL unknown)")
	if b.UsesFunctions() {
		t.Error("UsesFunctions true although FCALL is an unknown command")
	}
	c.check(t, "second check")
}

// TestConformanceSingleScripts runs the conformance suite and the exactness
// hammer with Functions disabled: the EVALSHA path decides the same.
func TestConformanceSingleScripts(t *testing.T) {
	r := testenv.RedisServer(t)
	newScripted := func(t *testing.T, prefix string, now func() time.Time) limiter.Limiter {
		b, err := New(Options{URL: "redis://" + r.Addr, KeyPrefix: prefix, Now: now, Timeout: testTimeout, DisableFunctions: true})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		if b.UsesFunctions() {
			t.Fatal("UsesFunctions true with DisableFunctions")
		}
		return b
	}
	var p prefixes
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		return newScripted(t, p.next(), now)
	})
	// The hammer's instances share one store: one prefix for all.
	t.Run("hammer", func(t *testing.T) {
		hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
			return newScripted(t, "scripts:", now)
		})
	})
}
