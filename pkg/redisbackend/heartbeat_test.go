package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

func TestHeartbeat(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := newSingle(t, r, DefaultKeyPrefix, clock.Now)
	ctx := context.Background()
	beat := func(id string, ttl time.Duration) int {
		t.Helper()
		n, err := b.Beat(ctx, id, ttl)
		if err != nil {
			t.Fatalf("Beat(%s): %v", id, err)
		}
		return n
	}
	if n := beat("a", 10*time.Second); n != 1 {
		t.Errorf("live after a = %d, want 1", n)
	}
	if n := beat("b", 10*time.Second); n != 2 {
		t.Errorf("live after b = %d, want 2", n)
	}
	if n := beat("c", 3*time.Second); n != 3 {
		t.Errorf("live after c = %d, want 3", n)
	}
	if n := beat("a", 10*time.Second); n != 3 {
		t.Errorf("a beating again = %d, want 3", n)
	}
	clock.Advance(3 * time.Second) // c expires exactly now
	if n := beat("a", 10*time.Second); n != 2 {
		t.Errorf("after c expired = %d, want 2", n)
	}
	if n, err := b.Leave(ctx, "b"); err != nil || n != 1 {
		t.Errorf("Leave(b) = %d, %v; want 1", n, err)
	}
	clock.Advance(10 * time.Second)
	if n, err := b.Leave(ctx, "nobody"); err != nil || n != 0 {
		t.Errorf("after a expired = %d, %v; want 0", n, err)
	}
	if _, err := b.Beat(ctx, "", time.Second); err == nil {
		t.Error("Beat with an empty id succeeded")
	}
	if _, err := b.Beat(ctx, "x", 0); err == nil {
		t.Error("Beat with ttl 0 succeeded")
	}

	// On Redis TIME (production) the key expires with its last member.
	live := newSingle(t, r, "live:", nil)
	if n, err := live.Beat(ctx, "x", time.Minute); err != nil || n != 1 {
		t.Fatalf("Beat on Redis TIME = %d, %v", n, err)
	}
	ttl, err := r.Client().PTTL(ctx, "live:instances").Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Errorf("PTTL of the instance set = %v, %v; want (0, 1m]", ttl, err)
	}
}
