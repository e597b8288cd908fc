package redisbackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

func TestOptionsValidation(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
		want []string // substrings of the error; nil means valid
	}{
		{"url", Options{URL: "redis://127.0.0.1:6379/0"}, nil},
		{"cluster", Options{ClusterAddrs: []string{"a:1", "b:2"}}, nil},
		{"sentinel", Options{SentinelAddrs: []string{"a:1"}, SentinelMaster: "m"}, nil},
		{"none", Options{}, []string{"--redis.url", "--redis.cluster-addrs", "--redis.sentinel-addrs"}},
		{"two", Options{URL: "redis://x:1", ClusterAddrs: []string{"a:1"}}, []string{"--redis.url and --redis.cluster-addrs are mutually exclusive"}},
		{"sentinel without master", Options{SentinelAddrs: []string{"a:1"}}, []string{"--redis.sentinel-master is required"}},
		{"master without sentinels", Options{URL: "redis://x:1", SentinelMaster: "m"}, []string{"--redis.sentinel-addrs is empty"}},
		{"bad url", Options{URL: "http://x:1"}, []string{"--redis.url"}},
		{"unix socket", Options{URL: "unix:///run/redis/redis.sock?db=2"}, nil},
		{"unix socket without a path", Options{URL: "unix://"}, []string{"--redis.url", "empty unix socket path"}},
		{"unix socket with a host", Options{URL: "unix://var/run/redis.sock"}, []string{"names a host (var)", "unix:///absolute/path"}},
		// A URL refused at start names no password (its error is logged):
		// url.Error quoted the whole URL, and an escape error the escape.
		{"password with a bad escape", Options{URL: "redis://app:Zq7%xSecret@127.0.0.1:6379/0"}, []string{"--redis.url: parse: a % not followed by two hexadecimal digits (write a % in a password as %25)"}},
		{"bad port with a password", Options{URL: "redis://app:Zq7xSecret@127.0.0.1:63a9/0"}, []string{`--redis.url: parse: invalid port ":63a9" after host`}},
		{"unix socket with a host and a password", Options{URL: "unix://app:Zq7xSecret@localhost/run/redis.sock"}, []string{"--redis.url unix://app:xxxxx@localhost/run/redis.sock names a host (localhost)"}},
		{"unix socket path too long", Options{URL: "unix:///" + strings.Repeat("d", 120)}, []string{"is 121 bytes, longer than a Unix socket address holds (107)"}},
		{"unix socket with TLS", Options{URL: "unix:///run/redis/redis.sock", TLS: func() *tls.Config { return &tls.Config{} }}, []string{"--redis.url /run/redis/redis.sock is a Unix socket", "remove the --redis.tls.* flags"}},
		{"empty address", Options{ClusterAddrs: []string{"a:1", " "}}, []string{"empty addresses"}},
		{"brace prefix", Options{URL: "redis://x:1", KeyPrefix: "a{b}:"}, []string{"--redis.key-prefix"}},
		{"negative pool", Options{URL: "redis://x:1", PoolSize: -1}, []string{"--redis.pool-size -1 is negative"}},
		{"negative batch", Options{URL: "redis://x:1", MaxBatch: -1}, []string{"--redis.max-batch -1 is negative"}},
		{"senders over pool", Options{URL: "redis://x:1", PoolSize: 2, Senders: 3}, []string{"--redis.senders 3 leaves no connection of the client's pool of 2"}},
		{"senders fill pool", Options{URL: "redis://x:1", PoolSize: 2, Senders: 2}, []string{"--redis.senders 2 leaves no connection of the client's pool of 2"}},
		{"pool_size in the url", Options{URL: "redis://x:1?pool_size=2"}, []string{fmt.Sprintf("--redis.senders %d leaves no connection of the client's pool of 2", DefaultSenders), "pool_size in --redis.url"}},
		{"pool_size in the url over senders", Options{URL: "redis://x:1?pool_size=3"}, nil},
		{"flag over pool_size in the url", Options{URL: "redis://x:1?pool_size=2", PoolSize: 3}, nil},
		// go-redis caps the connections open at once with max_active_conns
		// too: the senders must leave one of those free as well.
		{"max_active_conns in the url", Options{URL: "redis://x:1?max_active_conns=2"}, []string{fmt.Sprintf("--redis.senders %d leaves no connection of the client's pool of 2", DefaultSenders), "max_active_conns in --redis.url"}},
		{"max_active_conns under the flag's pool", Options{URL: "redis://x:1?max_active_conns=2", PoolSize: 8}, []string{"leaves no connection of the client's pool of 2", "max_active_conns in --redis.url", "below its pool size of 8"}},
		{"max_active_conns equal to pool_size", Options{URL: "redis://x:1?pool_size=2&max_active_conns=2"}, []string{"leaves no connection of the client's pool of 2", "pool_size in --redis.url, and max_active_conns"}},
		{"max_active_conns over pool_size", Options{URL: "redis://x:1?pool_size=2&max_active_conns=8"}, []string{"leaves no connection of the client's pool of 2 (--redis.pool-size, or pool_size in --redis.url)"}},
		{"max_active_conns in the url over senders", Options{URL: "redis://x:1?max_active_conns=3"}, nil},
		{"sentinel pool", Options{SentinelAddrs: []string{"a:1"}, SentinelMaster: "m", PoolSize: 2}, []string{"leaves no connection of the client's pool of 2"}},
		{"default senders fill pool", Options{URL: "redis://x:1", PoolSize: DefaultSenders}, []string{fmt.Sprintf("--redis.senders %d leaves no connection", DefaultSenders)}},
		{"senders below pool", Options{URL: "redis://x:1", PoolSize: 3, Senders: 2}, nil},
		{"senders off", Options{URL: "redis://x:1", PoolSize: 2, Senders: -1}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := New(c.opts)
			if c.want == nil {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				b.Close()
				return
			}
			if err == nil {
				b.Close()
				t.Fatalf("New succeeded, want an error with %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "Zq7") || strings.Contains(err.Error(), "xS") {
				t.Errorf("error %q shows (a piece of) the URL's password", err)
			}
		})
	}
}

func TestURLCredentialsAndOverride(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithPassword("s3cret"))
	ctx := context.Background()
	for _, c := range []struct {
		name string
		opts Options
		ok   bool
	}{
		{"password in url", Options{URL: "redis://:s3cret@" + r.Addr}, true},
		{"no password", Options{URL: "redis://" + r.Addr}, false},
		{"override", Options{URL: "redis://:wrong@" + r.Addr, Password: "s3cret"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Timeout = testTimeout
			b, err := New(c.opts)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer b.Close()
			err = b.Ping(ctx)
			if c.ok && err != nil {
				t.Fatalf("Ping: %v", err)
			}
			if !c.ok && !errors.Is(err, limiter.ErrUnavailable) {
				t.Fatalf("Ping = %v, want ErrUnavailable", err)
			}
		})
	}
}

// TestProtocol: the Backend's connections speak RESP2 (CLIENT LIST shows
// resp=2 for every connection but the observer's), unless the URL asks for
// RESP3; the Cluster and Sentinel clients are configured for RESP2 too.
func TestProtocol(t *testing.T) {
	r := testenv.RedisServer(t)
	ctx := context.Background()
	for _, c := range []struct {
		url  string
		want string
	}{
		{"redis://" + r.Addr, "2"},
		{"redis://" + r.Addr + "?protocol=3", "3"},
	} {
		t.Run("resp="+c.want, func(t *testing.T) {
			b, err := New(Options{URL: c.url, Timeout: testTimeout})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer b.Close()
			res := make([]limiter.Result, 1)
			if err := b.Check(ctx, []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}}, res); err != nil {
				t.Fatalf("Check: %v", err)
			}
			clients := r.Clients(t)
			for _, cl := range clients {
				if cl.Resp != c.want {
					t.Errorf("connection %+v, want resp=%s", cl, c.want)
				}
			}
			if len(clients) == 0 {
				t.Error("no connection of the Backend in CLIENT LIST")
			}
		})
	}
	for _, topo := range []struct {
		name string
		opts Options
		t    topology
	}{
		{"cluster", Options{ClusterAddrs: []string{"127.0.0.1:1"}}, topoCluster},
		{"sentinel", Options{SentinelAddrs: []string{"127.0.0.1:1"}, SentinelMaster: "m"}, topoSentinel},
	} {
		c, err := topo.opts.newClient(topo.t)
		if err != nil {
			t.Fatalf("%s: %v", topo.name, err)
		}
		var got int
		switch c := c.(type) {
		case *redis.ClusterClient:
			got = c.Options().Protocol
		case *redis.Client:
			got = c.Options().Protocol
		}
		c.Close()
		if got != 2 {
			t.Errorf("%s client: Protocol %d, want 2", topo.name, got)
		}
	}
}

func TestInvalidRequests(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	lim := limiter.Limit{Requests: 10, Window: time.Second}
	for _, c := range []struct {
		name string
		reqs []limiter.Request
		n    int
	}{
		{"results length", []limiter.Request{{Key: "k", Limit: lim}}, 2},
		{"empty key", []limiter.Request{{Limit: lim}}, 1},
		{"zero window", []limiter.Request{{Key: "k", Limit: limiter.Limit{Requests: 1}}}, 1},
		{"huge hits", []limiter.Request{{Key: "k", Limit: lim, Hits: 1 << 53}}, 1},
		{"inexact product", []limiter.Request{{Key: "k", Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Burst: 1 << 40, Window: 24 * time.Hour}}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := b.Check(context.Background(), c.reqs, make([]limiter.Result, c.n))
			if !errors.Is(err, limiter.ErrInvalid) {
				t.Errorf("Check = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestUnavailable: a stopped, a paused and a misused Redis all give errors
// wrapping ErrUnavailable with the cause kept, and the same Backend decides
// again once Redis is back.
func TestUnavailable(t *testing.T) {
	r := testenv.RedisServer(t)
	b, err := New(Options{URL: "redis://" + r.Addr, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	ctx := context.Background()
	reqs := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}}
	res := make([]limiter.Result, 1)
	check := func() error { return b.Check(ctx, reqs, res) }

	// Decide once with a generous deadline of the caller's own: the caller's
	// deadline is not shortened unless Timeout is shorter.
	long, cancel := context.WithTimeout(ctx, testTimeout)
	if err := b.Check(long, reqs, res); err != nil || !res[0].Allowed {
		t.Fatalf("Check = %v %+v", err, res[0])
	}
	cancel()

	t.Run("paused", func(t *testing.T) {
		r.Pause()
		err := check()
		perr := b.Ping(ctx)
		r.Resume()
		if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Check on a paused Redis = %v, want ErrUnavailable and DeadlineExceeded", err)
		}
		if !errors.Is(perr, limiter.ErrUnavailable) {
			t.Errorf("Ping on a paused Redis = %v, want ErrUnavailable", perr)
		}
	})
	t.Run("caller deadline", func(t *testing.T) {
		expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		err := b.Check(expired, reqs, res)
		if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Check with an expired deadline = %v", err)
		}
	})
	t.Run("stopped", func(t *testing.T) {
		r.Stop()
		err := check()
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Check on a stopped Redis = %v, want ErrUnavailable", err)
		}
		r.Start()
		if err := waitFor(func() error { return check() }); err != nil {
			t.Fatalf("the Backend does not recover after Redis restarted: %v", err)
		}
		if !res[0].Allowed {
			t.Errorf("restarted (empty) Redis denied: %+v", res[0])
		}
	})
	t.Run("out of memory", func(t *testing.T) {
		// Redis refuses the script (it writes) once its memory is over
		// maxmemory: a failure to decide, not a malformed request.
		c := r.Client()
		if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatalf("CONFIG SET maxmemory: %v", err)
		}
		err := check()
		if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatalf("CONFIG SET maxmemory 0: %v", err)
		}
		if !errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("Check on a Redis out of memory = %v, want ErrUnavailable with OOM", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		c, err := New(Options{URL: "redis://" + r.Addr})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c.Close()
		if err := c.Check(ctx, reqs, res); !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Check after Close = %v, want ErrUnavailable", err)
		}
	})
}

// waitFor polls f until it succeeds or 30 s pass (a server coming back has no
// signal to await from the client's side).
func waitFor(f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}
func TestNewFromClient(t *testing.T) {
	r := testenv.RedisServer(t)
	if _, err := NewFromClient(nil, Options{}); err == nil {
		t.Error("NewFromClient(nil) succeeded")
	}
	// A caller's client, which must end a call at its context's deadline.
	own := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true})
	defer own.Close()
	if _, err := NewFromClient(own, Options{KeyPrefix: "{x}:"}); err == nil {
		t.Error("NewFromClient with a braced prefix succeeded")
	}
	// One that would not (go-redis's default), single-node or Cluster: a
	// stalled Redis would hold its Checks past their deadline.
	stock := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer stock.Close()
	stockCluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.Addr}})
	defer stockCluster.Close()
	for _, c := range []redis.UniversalClient{stock, stockCluster} {
		if _, err := NewFromClient(c, Options{}); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
			t.Errorf("NewFromClient(%T without ContextTimeoutEnabled) = %v, want it refused naming the option", c, err)
		}
	}
	// A caller's client whose pool the sender slots would fill.
	small := redis.NewClient(&redis.Options{Addr: r.Addr, PoolSize: DefaultSenders, ContextTimeoutEnabled: true})
	defer small.Close()
	if _, err := NewFromClient(small, Options{}); err == nil || !strings.Contains(err.Error(), "leaves no connection of the client's pool") {
		t.Errorf("NewFromClient with a pool of %d = %v, want the pool refused", DefaultSenders, err)
	}
	// One whose pool is large but whose active connections are capped at
	// as many as the sender slots keep (MaxActiveConns).
	capped := redis.NewClient(&redis.Options{Addr: r.Addr, PoolSize: 10, MaxActiveConns: DefaultSenders, ContextTimeoutEnabled: true})
	defer capped.Close()
	if _, err := NewFromClient(capped, Options{}); err == nil || !strings.Contains(err.Error(), "max_active_conns") {
		t.Errorf("NewFromClient with MaxActiveConns %d = %v, want the pool refused naming max_active_conns", DefaultSenders, err)
	}
	b, err := NewFromClient(own, Options{KeyPrefix: "own:", Timeout: testTimeout})
	if err != nil {
		t.Fatalf("NewFromClient: %v", err)
	}
	ctx := context.Background()
	res := make([]limiter.Result, 1)
	req := []limiter.Request{{Key: key("k"), Limit: limiter.Limit{Requests: 1, Window: time.Minute}, Hits: 1}}
	if err := b.Check(ctx, req, res); err != nil || !res[0].Allowed {
		t.Fatalf("Check = %v, %+v", err, res[0])
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The caller's client stays open.
	if err := own.Ping(ctx).Err(); err != nil {
		t.Errorf("client closed by Backend.Close: %v", err)
	}
	n, err := r.Client().Keys(ctx, "own:*").Result()
	if err != nil || len(n) != 1 {
		t.Errorf("keys under the prefix = %v, %v; want one", n, err)
	}
}
