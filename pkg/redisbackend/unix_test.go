package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestUnixSocket: a unix:// URL reaches a Redis on the same host over its
// Unix socket. Every connection the Backend opens is a socket client
// (CLIENT LIST, seen from an observer on TCP), the database of the URL's
// ?db= holds the counters, and four instances hammering one key over the
// socket admit exactly the model's count for every algorithm.
func TestUnixSocket(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithUnixSocket())
	ctx := context.Background()
	url := "unix://" + r.Socket

	t.Run("connections and db", func(t *testing.T) {
		b, err := New(Options{URL: url + "?db=3", KeyPrefix: "u:", Timeout: testTimeout})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer b.Close()
		res := make([]limiter.Result, 1)
		req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}}
		if err := b.Check(ctx, req, res); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if !res[0].Allowed {
			t.Fatalf("first request of a limit of 10: %+v, want allowed", res[0])
		}
		observer := r.Client()
		if n, err := observer.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("db 0 holds %d keys (%v), want none: the counters belong in db 3", n, err)
		}
		if n, err := observer.Do(ctx, "EVAL", "redis.call('SELECT', 3) return redis.call('DBSIZE')", 0).Int64(); err != nil || n == 0 {
			t.Errorf("db 3 holds %d keys (%v), want the counter", n, err)
		}
		r.CheckClientsOnSocket(t)
	})

	t.Run("hammer", func(t *testing.T) {
		hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
			return newOnURL(t, url, DefaultKeyPrefix, now)
		})
	})
}
