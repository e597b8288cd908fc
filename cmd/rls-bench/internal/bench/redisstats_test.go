package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

func TestParseRedisStats(t *testing.T) {
	info := "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:1200\r\ninstantaneous_ops_per_sec:0\r\ntotal_reads_processed:345\r\n"
	s, err := parseRedisStats(info)
	if err != nil || s != (redisStats{commands: 1200, reads: 345}) {
		t.Errorf("parseRedisStats = %+v, %v; want 1200 commands, 345 reads", s, err)
	}
	for _, bad := range []string{
		"# Stats\r\ntotal_commands_processed:1200\r\n", // Redis 5: no reads
		"total_commands_processed:x\r\ntotal_reads_processed:1\r\n",
		"total_commands_processed:-1\r\ntotal_reads_processed:1\r\n",
	} {
		if _, err := parseRedisStats(bad); err == nil {
			t.Errorf("parseRedisStats(%q): no error", bad)
		}
	}
}

func TestRedisUseBetween(t *testing.T) {
	before := []redisStats{{commands: 100, reads: 50}, {commands: 10, reads: 10}}
	after := []redisStats{{commands: 161, reads: 71}, {commands: 31, reads: 21}}
	u := redisUseBetween(before, after, 20)
	// Each server's delta loses one command and one read: the INFOs'.
	want := RedisUse{Servers: 2, Commands: 60 + 20, Reads: 20 + 10, CommandsPerReq: 4, ReadsPerReq: 1.5}
	if u == nil || *u != want {
		t.Errorf("redisUseBetween = %+v, want %+v", u, want)
	}
	if u := redisUseBetween(before, []redisStats{{commands: 5, reads: 60}, {commands: 31, reads: 21}}, 20); u != nil {
		t.Errorf("a server's count went back (a restart): %+v, want nil", u)
	}
	if u := redisUseBetween(before, after, 0); u == nil || u.CommandsPerReq != 0 || u.Commands != 80 {
		t.Errorf("no answered request: %+v, want the counts and no per-request figures", u)
	}
}

// incrServer answers OK to every request after one INCR on its Redis, on
// one of conns connections made before the run: exactly one command and one
// round trip per request, which Run's Redis figures must show.
type incrServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	conns chan *redis.Conn
}

func (s *incrServer) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	c := <-s.conns
	defer func() { s.conns <- c }()
	if err := c.Incr(ctx, "bench:incr").Err(); err != nil {
		return nil, err
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestRunCountsRedisRoundTrips runs against a server that makes one Redis
// round trip of one command per request, on a real redis-server: Run
// reports exactly one command and one read event per answered request
// (the INFOs themselves not counted), and the table shows them.
func TestRunCountsRedisRoundTrips(t *testing.T) {
	rs := testenv.RedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr, PoolSize: 4})
	t.Cleanup(func() { client.Close() })
	const conns = 3
	srv := &incrServer{conns: make(chan *redis.Conn, conns)}
	ctx := context.Background()
	for range conns {
		c := client.Conn()
		t.Cleanup(func() { c.Close() })
		if err := c.Ping(ctx).Err(); err != nil { // the handshake, before the run
			t.Fatal(err)
		}
		srv.conns <- c
	}
	addr := serveRLS(t, srv)

	res, err := Run(ctx, Options{
		Addr:        addr,
		Concurrency: 5,
		Requests:    300,
		Descriptors: mustTemplates(t, "remote_address=10.0.{i}"),
		Redis:       []string{"redis://" + rs.Addr},
		Timeout:     time.Minute,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.OK != 300 || res.Errors != 0 {
		t.Fatalf("ok=%d errors=%d (%v), want 300 and none", res.OK, res.Errors, res.ErrorKinds)
	}
	want := RedisUse{Servers: 1, Commands: 300, Reads: 300, CommandsPerReq: 1, ReadsPerReq: 1}
	if res.Redis == nil || *res.Redis != want {
		t.Errorf("Redis = %+v, want %+v", res.Redis, want)
	}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, []*Result{res}, Aligned); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "redis cmds/req  redis reads/req") || !strings.Contains(tbl.String(), "1.00             1.00") {
		t.Errorf("table lacks the Redis figures:\n%s", tbl.String())
	}

	if _, err := Run(ctx, Options{Addr: addr, Requests: 1, Descriptors: mustTemplates(t, "k=v"), Redis: []string{"http://" + rs.Addr}}); err == nil ||
		!strings.Contains(err.Error(), "http://"+rs.Addr) {
		t.Errorf("Run with a Redis URL of another scheme: %v, want an error naming it", err)
	}
}
