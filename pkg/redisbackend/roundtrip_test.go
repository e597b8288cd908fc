package redisbackend

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// commandCounter is a go-redis hook that counts the commands a client sends.
type commandCounter struct {
	mu    sync.Mutex
	names map[string]int
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.names[cmd.Name()]++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		for _, cmd := range cmds {
			c.names[cmd.Name()]++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestOneRoundTripPerCheck: N Checks of 3 requests each on a single node are
// N FCALL calls (N EVALSHA with Functions disabled) and nothing else, seen
// from the client (a hook) and from the server (INFO commandstats; the only
// other commands are those the script itself runs: TIME and MGET exactly once
// per call, then the writes).
func TestOneRoundTripPerCheck(t *testing.T) {
	for _, verb := range []string{"fcall", "evalsha"} {
		t.Run(verb, func(t *testing.T) { testOneRoundTripPerCheck(t, verb) })
	}
}

func testOneRoundTripPerCheck(t *testing.T, verb string) {
	r := testenv.RedisServer(t)
	// One sender slot, so that the warm-up below also opens the connection every
	// later call goes through.
	b, err := New(Options{URL: "redis://" + r.Addr, Timeout: testTimeout, DisableFunctions: verb == "evalsha", Senders: 1})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	counter := &commandCounter{names: map[string]int{}}
	b.client.AddHook(counter)
	ctx := context.Background()
	reqs := []limiter.Request{
		{Key: key("edge", "a"), Limit: limiter.Limit{Requests: 1 << 30, Window: time.Hour}, Hits: 1},
		{Key: key("edge", "b"), Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1 << 30, Window: time.Hour}, Hits: 1},
		{Key: key("edge", "c"), Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1 << 30, Window: time.Hour}, Hits: 1},
	}
	res := make([]limiter.Result, len(reqs))
	// Warm up: connect (HELLO, CLIENT SETINFO) and load the code (FCALL
	// answered "Function not found", FUNCTION LOAD, FCALL again; or EVALSHA
	// answered NOSCRIPT, then EVAL).
	if err := b.Check(ctx, reqs, res); err != nil {
		t.Fatalf("Check: %v", err)
	}
	observer := r.Client()
	if err := observer.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
	counter.mu.Lock()
	clear(counter.names)
	counter.mu.Unlock()

	const n = 200
	for i := 0; i < n; i++ {
		if err := b.Check(ctx, reqs, res); err != nil {
			t.Fatalf("Check %d: %v", i, err)
		}
		for j, x := range res {
			if !x.Allowed {
				t.Fatalf("Check %d: request %d denied", i, j)
			}
		}
	}

	counter.mu.Lock()
	sent := map[string]int{}
	for k, v := range counter.names {
		sent[k] = v
	}
	counter.mu.Unlock()
	if len(sent) != 1 || sent[verb] != n {
		t.Errorf("client sent %v for %d Checks, want only %d %s", sent, n, n, verb)
	}

	stats := r.CommandCalls(t)
	if stats[verb] != int64(n) {
		t.Errorf("server ran %d %s for %d Checks", stats[verb], verb, n)
	}
	if stats["time"] != int64(n) {
		t.Errorf("server ran TIME %d times for %d Checks, want one per script", stats["time"], n)
	}
	if stats["mget"] != int64(n) {
		t.Errorf("server ran MGET %d times for %d Checks, want one per script (every counter read at once)", stats["mget"], n)
	}
	inScript := map[string]bool{"time": true, "mget": true, "set": true, "setrange": true}
	observed := map[string]bool{"info": true, "config|resetstat": true}
	for cmd, calls := range stats {
		if cmd != verb && !inScript[cmd] && !observed[cmd] {
			t.Errorf("unexpected command %s (%d calls)", cmd, calls)
		}
	}
}

// TestTokenBucketExpiresWhenFull: a token bucket's key expires when the
// bucket is full again, the reset its last Check reported (measured later, so
// no longer), and not before; a key left longer would change no decision but
// hold Redis memory. 1,000 hits a second cost 1 ms each.
func TestTokenBucketExpiresWhenFull(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	req := []limiter.Request{{Key: key("edge", "bucket"), Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Window: time.Second}, Hits: 300}}
	res := make([]limiter.Result, 1)
	for i := range 2 {
		if err := b.Check(context.Background(), req, res); err != nil || !res[0].Allowed {
			t.Fatalf("Check %d: %+v, %v; want admitted", i, res[0], err)
		}
	}
	ttl, err := r.Client().PTTL(context.Background(), baseKey(DefaultKeyPrefix, req[0])).Result()
	if err != nil {
		t.Fatal(err)
	}
	// 600 hits of debt, less what drained between the Checks.
	if res[0].ResetAfter <= 0 || res[0].ResetAfter > 600*time.Millisecond {
		t.Errorf("reset after two Checks of 300 hits: %v, want in (0, 600ms]", res[0].ResetAfter)
	}
	if ttl <= 0 || ttl > res[0].ResetAfter {
		t.Errorf("the bucket's key expires in %v; want in (0, %v], when it is full again", ttl, res[0].ResetAfter)
	}
}
