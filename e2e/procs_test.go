package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/envoy-rls/envoy-rls/internal/listen"
	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

const (
	// readyTimeout bounds how long a started process may take to become
	// ready. The machines are shared and slow; a healthy start takes well
	// under a second.
	readyTimeout = 60 * time.Second
	// stopTimeout bounds a graceful stop before SIGKILL.
	stopTimeout = 20 * time.Second
	// pollInterval is the pause between two readiness probes.
	pollInterval = 20 * time.Millisecond
	// logTail is how much of a process log a failing test prints.
	logTail = 16 << 10
)

// proc is one child process whose output goes to a log file; it is stopped
// (SIGTERM, then SIGKILL) when the test ends and its log is printed when the
// test failed.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when cmd.Wait returned
	err  error         // cmd.Wait's result, valid after done
}

func startProc(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	testenv.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{t: t, name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s log (%s):\n%s", name, filepath.Base(logPath), p.Log())
		}
	})
	return p
}

// Stop sends SIGTERM and waits for the exit, escalating to SIGKILL.
func (p *proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Log returns the end of the process log.
func (p *proc) Log() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	return string(b)
}

// pollUntil calls try every pollInterval until it returns nil, and fails
// the test when the process exits or readyTimeout passes first, naming what
// it waited for and try's last error. ctx ends at that deadline.
func (p *proc) pollUntil(what string, try func(ctx context.Context) error) {
	p.t.Helper()
	if err := p.poll(what, try); err != nil {
		p.t.Fatal(err)
	}
}

// errExited is poll's error when the process exited first.
var errExited = errors.New("exited")

// poll is pollUntil returning its failure (wrapping errExited when the
// process exited first) instead of failing the test.
func (p *proc) poll(what string, try func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := try(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s %w before %s (%v):\n%s", p.name, errExited, what, p.err, p.Log())
		case <-ctx.Done():
			return fmt.Errorf("%s: no %s after %v: %v\n%s", p.name, what, readyTimeout, err, p.Log())
		case <-tick.C:
		}
	}
}

// servingRE finds the addresses in envoy-rls's "envoy-rls serving" log
// line, text or JSON.
var servingRE = regexp.MustCompile(`envoy-rls serving"?[ ,]+"?grpc"?[=:]"?([^\s",]+)"?[ ,]+"?http"?[=:]"?([^\s",]+)`)

// servingAddrs waits for envoy-rls's "envoy-rls serving" line and returns
// the gRPC and HTTP addresses it listens on: started on port 0, it is the
// only one that can have them, where a port chosen free beforehand may
// have been taken by another test binary since.
func (p *proc) servingAddrs() (grpcAddr, httpAddr string) {
	p.t.Helper()
	p.pollUntil(`"envoy-rls serving" in its log`, func(context.Context) error {
		b, err := os.ReadFile(p.log)
		if err != nil {
			return err
		}
		m := servingRE.FindSubmatch(b)
		if m == nil {
			return errors.New("not logged yet")
		}
		grpcAddr, httpAddr = string(m[1]), string(m[2])
		return nil
	})
	return grpcAddr, httpAddr
}

// waitJSONRecord polls the process log, which must be JSON records (slog's
// JSON handler, one per line), until one satisfies match, and returns every
// complete record read. A line that is no JSON record, the process's exit or
// the deadline fails the test.
func (p *proc) waitJSONRecord(what string, match func(map[string]any) bool) []map[string]any {
	p.t.Helper()
	var records []map[string]any
	p.pollUntil(what+" in its log", func(context.Context) error {
		b, err := os.ReadFile(p.log)
		if err != nil {
			p.t.Fatal(err)
		}
		// A record still being written has no newline yet.
		b = b[:bytes.LastIndexByte(b, '\n')+1]
		records = records[:0]
		found := false
		for line := range bytes.Lines(b) {
			var r map[string]any
			if err := json.Unmarshal(line, &r); err != nil {
				p.t.Fatalf("%s log: a line that is no JSON record (%v): %s", p.name, err, line)
			}
			records = append(records, r)
			found = found || match(r)
		}
		if !found {
			return errors.New("not logged yet")
		}
		return nil
	})
	return records
}

// waitHTTP polls url until it answers 200, the process exits or the deadline
// passes; it fails the test in the last two cases.
func (p *proc) waitHTTP(url string) {
	p.t.Helper()
	p.pollUntil(url+" answering 200", func(ctx context.Context) error { return get200(ctx, url) })
}

// get200 GETs url and returns an error unless it answers 200.
func get200(ctx context.Context, url string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// rls is a running envoy-rls.
type rls struct {
	*proc
	GRPCAddr, HTTPAddr string
}

// rlsOptions configures startRLS.
type rlsOptions struct {
	// ConfigDir is the descriptor folder (default: e2e/testdata/config).
	ConfigDir string
	// Redis is the Redis address (host:port); empty runs in memory.
	Redis string
	// RedisURL, when set, is the --redis.url itself (unix://...), instead
	// of Redis.
	RedisURL string
	// GRPCAddr, when set, is the --grpc.addr (unix:/path), instead of a free
	// loopback port.
	GRPCAddr string
	// Args are extra flags.
	Args []string
}

// startRLS starts envoy-rls on free loopback ports and waits for /readyz.
func startRLS(t testing.TB, o rlsOptions) *rls {
	t.Helper()
	if o.ConfigDir == "" {
		o.ConfigDir = filepath.Join(repoRoot(t), "e2e", "testdata", "config")
	}
	grpcAddr := o.GRPCAddr
	if grpcAddr == "" {
		grpcAddr = "127.0.0.1:0"
	}
	args := []string{envoyRLSBinary(t), "serve",
		"--config.dir", o.ConfigDir,
		"--grpc.addr", grpcAddr,
		"--http.addr", "127.0.0.1:0",
		"--debug.addr", "127.0.0.1:0",
	}
	switch {
	case o.RedisURL != "":
		args = append(args, "--redis.url", o.RedisURL)
	case o.Redis != "":
		args = append(args, "--redis.url", "redis://"+o.Redis)
	}
	args = append(args, o.Args...)
	r := &rls{proc: startProc(t, "envoy-rls", args...)}
	r.GRPCAddr, r.HTTPAddr = r.servingAddrs()
	if o.GRPCAddr != "" {
		r.GRPCAddr = o.GRPCAddr // as given: unix:/path
	}
	r.waitHTTP("http://" + r.HTTPAddr + "/readyz")
	return r
}

// envoy is a running Envoy with the shipped envoy.yaml, rewritten to loopback
// ports.
type envoy struct {
	*proc
	// URL is the edge listener ("http://127.0.0.1:<port>"), Admin the admin
	// API.
	URL, Admin string
}

// startEnvoy runs the shipped envoy/envoy.yaml with its listeners, admin and
// the envoy_rls cluster moved to loopback ports (the cluster to
// rlsGRPCAddr: host:port, or unix:/path for a pipe address), and waits until
// the admin API reports it ready.
func startEnvoy(t testing.TB, rlsGRPCAddr string) *envoy {
	t.Helper()
	return startEnvoyTLS(t, rlsGRPCAddr, nil)
}

// startEnvoyTLS is startEnvoy with rlsTLS, when not nil, as the envoy_rls
// cluster's transport_socket.
func startEnvoyTLS(t testing.TB, rlsGRPCAddr string, rlsTLS map[string]any) *envoy {
	t.Helper()
	for attempt := 1; ; attempt++ {
		e, err := tryStartEnvoy(t, rlsGRPCAddr, rlsTLS)
		if err == nil {
			return e
		}
		// A listener's port, free when chosen, taken since by another
		// test binary: Envoy exits, and starts again on fresh ports.
		if attempt == 3 || !errors.Is(err, errExited) || !strings.Contains(err.Error(), "ddress already in use") {
			t.Fatal(err)
		}
		t.Logf("envoy: a port was taken, starting again: %v", err)
	}
}

// tryStartEnvoy is one attempt of startEnvoyTLS. Admin listens on port 0,
// and Envoy writes the address it got to a file (--admin-address-path):
// only this Envoy can answer there. The edge and backend listeners take
// ports chosen free; Envoy exits when it cannot bind one.
func tryStartEnvoy(t testing.TB, rlsGRPCAddr string, rlsTLS map[string]any) (*envoy, error) {
	t.Helper()
	edge, backend := testenv.FreePort(t), testenv.FreePort(t)
	ports := envoyPorts{Admin: 0, Edge: edge, Backend: backend, RLSTimeout: testRLSTimeout, RLSTLS: rlsTLS}
	if listen.IsUnix(rlsGRPCAddr) {
		pipe, err := listen.UnixPath(rlsGRPCAddr)
		if err != nil {
			t.Fatal(err)
		}
		ports.RLSPipe = pipe
	} else {
		host, port, err := net.SplitHostPort(rlsGRPCAddr)
		if err != nil {
			t.Fatal(err)
		}
		if ports.RLSPort, err = strconv.Atoi(port); err != nil {
			t.Fatal(err)
		}
		ports.RLSHost = host
	}
	dir := t.TempDir()
	path, adminPath := filepath.Join(dir, "envoy.yaml"), filepath.Join(dir, "admin-address")
	if err := rewriteEnvoyConfig(envoyYAML(t), path, ports); err != nil {
		t.Fatal(err)
	}
	// The rewritten file must still pass the static checks.
	if _, err := loadEnvoyConfig(path); err != nil {
		t.Fatalf("rewritten envoy.yaml: %v", err)
	}
	e := &envoy{URL: fmt.Sprintf("http://127.0.0.1:%d", edge)}
	e.proc = startProc(t, "envoy", testenv.EnvoyBinary(t), "-c", path, "--admin-address-path", adminPath,
		"--use-dynamic-base-id", "--concurrency", "1", "-l", "warning")
	if err := e.poll("its admin address in "+adminPath, func(context.Context) error {
		b, err := os.ReadFile(adminPath)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return fmt.Errorf("not written yet (%v)", err)
		}
		e.Admin = "http://" + string(bytes.TrimSpace(b))
		return nil
	}); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.poll(e.Admin+"/ready answering 200", func(ctx context.Context) error { return get200(ctx, e.Admin+"/ready") }); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

// envoyPorts are the loopback addresses (and the pipe) rewriteEnvoyConfig sets.
type envoyPorts struct {
	Admin, Edge, Backend int
	RLSHost              string
	RLSPort              int
	// RLSPipe, when set, is the Unix socket of envoy-rls, instead of
	// RLSHost:RLSPort.
	RLSPipe string
	// RLSTimeout, when set, replaces the ratelimit filter's timeout.
	RLSTimeout time.Duration
	// RLSTLS, when set, is the envoy_rls cluster's transport_socket.
	RLSTLS map[string]any
}

// testRLSTimeout replaces envoy.yaml's 50 ms rate-limit timeout in the
// end-to-end tests. They check decisions, not latency: on a shared, slow
// machine (and under -race) a cold envoy-rls (first Redis connection, script
// load) can take longer than 50 ms, and Envoy would then fail open and turn a
// decision into a plain 200. envoy-rls still bounds its own Redis calls by
// --redis.timeout.
const testRLSTimeout = 10 * time.Second

// rewriteEnvoyConfig decodes the Envoy YAML at src, moves admin, the edge and
// backend listeners, the backend cluster and the envoy_rls cluster (made
// STATIC) to the given loopback addresses (envoy_rls to a pipe address if
// RLSPipe is set), and writes the result to dst.
func rewriteEnvoyConfig(src, dst string, p envoyPorts) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	sock := func(addr string, port int) map[string]any {
		return map[string]any{"socket_address": map[string]any{"address": addr, "port_value": port}}
	}
	admin, ok := doc["admin"].(map[string]any)
	if !ok {
		return errors.New("no admin")
	}
	admin["address"] = sock("127.0.0.1", p.Admin)

	res, _ := doc["static_resources"].(map[string]any)
	listeners, err := byName(res, "listeners")
	if err != nil {
		return err
	}
	clusters, err := byName(res, "clusters")
	if err != nil {
		return err
	}
	for name, port := range map[string]int{"edge": p.Edge, "backend": p.Backend} {
		l, ok := listeners[name]
		if !ok {
			return fmt.Errorf("no listener %q", name)
		}
		l["address"] = sock("127.0.0.1", port)
	}
	rlsAddr := sock(p.RLSHost, p.RLSPort)
	if p.RLSPipe != "" {
		rlsAddr = map[string]any{"pipe": map[string]any{"path": p.RLSPipe}}
	}
	for name, addr := range map[string]map[string]any{
		"backend":   sock("127.0.0.1", p.Backend),
		"envoy_rls": rlsAddr,
	} {
		c, ok := clusters[name]
		if !ok {
			return fmt.Errorf("no cluster %q", name)
		}
		c["type"] = "STATIC"
		delete(c, "dns_lookup_family")
		if name == "envoy_rls" && p.RLSTLS != nil {
			c["transport_socket"] = p.RLSTLS
		}
		c["load_assignment"] = map[string]any{
			"cluster_name": name,
			"endpoints": []any{map[string]any{
				"lb_endpoints": []any{map[string]any{"endpoint": map[string]any{"address": addr}}},
			}},
		}
	}
	if p.RLSTimeout > 0 {
		n := setRateLimitTimeout(listeners["edge"], p.RLSTimeout.String())
		if n != 1 {
			return fmt.Errorf("found %d ratelimit filters on listener edge, want 1", n)
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, out, 0o644)
}

// setRateLimitTimeout sets typed_config.timeout of every HTTP filter named
// envoy.filters.http.ratelimit below v and returns how many it changed.
func setRateLimitTimeout(v any, timeout string) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		if v["name"] == "envoy.filters.http.ratelimit" {
			if tc, ok := v["typed_config"].(map[string]any); ok {
				tc["timeout"] = timeout
				return 1
			}
		}
		for _, e := range v {
			n += setRateLimitTimeout(e, timeout)
		}
	case []any:
		for _, e := range v {
			n += setRateLimitTimeout(e, timeout)
		}
	}
	return n
}

// byName indexes the list res[field] of mappings by their "name".
func byName(res map[string]any, field string) (map[string]map[string]any, error) {
	list, ok := res[field].([]any)
	if !ok {
		return nil, fmt.Errorf("static_resources.%s is not a list", field)
	}
	out := map[string]map[string]any{}
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("static_resources.%s has a non-mapping entry", field)
		}
		name, _ := m["name"].(string)
		out[name] = m
	}
	return out, nil
}
