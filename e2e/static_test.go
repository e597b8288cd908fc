package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// envoyYAML returns the path of the shipped envoy/envoy.yaml.
func envoyYAML(t testing.TB) string { return filepath.Join(repoRoot(t), "envoy", "envoy.yaml") }

// mustLoadEnvoy loads the shipped envoy.yaml and fails the test on any problem.
func mustLoadEnvoy(t testing.TB) *envoyConfig {
	t.Helper()
	cfg, err := loadEnvoyConfig(envoyYAML(t))
	if err != nil {
		t.Fatalf("envoy/envoy.yaml:\n%v", err)
	}
	return cfg
}

// edgeHCM returns the HttpConnectionManager of the listener called "edge".
func edgeHCM(t testing.TB, cfg *envoyConfig) *hcmv3.HttpConnectionManager {
	t.Helper()
	for _, l := range cfg.Bootstrap.GetStaticResources().GetListeners() {
		if l.GetName() != "edge" {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) == nil {
					return hcm
				}
			}
		}
	}
	t.Fatal("envoy.yaml has no listener \"edge\" with an http_connection_manager")
	return nil
}

func TestEnvoyConfigDecodesStrictlyAndValidates(t *testing.T) {
	cfg := mustLoadEnvoy(t)
	bs := cfg.Bootstrap

	if sa := bs.GetAdmin().GetAddress().GetSocketAddress(); sa.GetAddress() != "127.0.0.1" || sa.GetPortValue() != 9901 {
		t.Errorf("admin listens on %s:%d, want 127.0.0.1:9901", sa.GetAddress(), sa.GetPortValue())
	}

	hcm := edgeHCM(t, cfg)
	if !hcm.GetUseRemoteAddress().GetValue() {
		t.Error("edge: use_remote_address is not true: the client IP would come from X-Forwarded-For")
	}
	if hcm.GetXffNumTrustedHops() != 0 {
		t.Errorf("edge: xff_num_trusted_hops = %d, want 0 at the edge", hcm.GetXffNumTrustedHops())
	}
	filters := hcm.GetHttpFilters()
	if len(filters) < 2 || filters[len(filters)-1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("edge: the router must be the last HTTP filter, got %v", filters)
	}
	var rl *ratelimitv3.RateLimit
	for _, f := range filters {
		if f.GetName() == "envoy.filters.http.ratelimit" {
			rl = &ratelimitv3.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rl == nil {
		t.Fatal("edge: no envoy.filters.http.ratelimit filter")
	}
	if rl.GetDomain() != "edge" {
		t.Errorf("ratelimit domain = %q, want edge", rl.GetDomain())
	}
	if rl.GetFailureModeDeny() {
		t.Error("ratelimit failure_mode_deny is true: the edge must fail open")
	}
	if rl.GetTimeout() == nil {
		t.Error("ratelimit timeout is not set explicitly (Envoy's 20 ms default)")
	}
	if rl.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
		t.Errorf("enable_x_ratelimit_headers = %v, want DRAFT_VERSION_03", rl.GetEnableXRatelimitHeaders())
	}
	if rl.GetDisableXEnvoyRatelimitedHeader() {
		t.Error("x-envoy-ratelimited is disabled")
	}

	cl := cfg.Cluster(cfg.RateLimitCluster())
	if cl == nil || cl.GetName() != "envoy_rls" {
		t.Fatalf("rate-limit cluster = %q, want envoy_rls", cfg.RateLimitCluster())
	}
	if cl.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster envoy_rls type = %v, want STRICT_DNS", cl.GetType())
	}
	host, port, err := clusterAddress(cl)
	if err != nil || host != "envoy-rls" || port != 8081 {
		t.Errorf("cluster envoy_rls address = %s:%d (%v), want envoy-rls:8081", host, port, err)
	}
	if err := requireHTTP2(cl); err != nil {
		t.Error(err)
	}

	// The demo upstream is Envoy's own "backend" listener.
	host, port, err = clusterAddress(cfg.Cluster("backend"))
	if err != nil {
		t.Fatal(err)
	}
	var backend *listenerv3.Listener
	for _, l := range bs.GetStaticResources().GetListeners() {
		if l.GetName() == "backend" {
			backend = l
		}
	}
	if sa := backend.GetAddress().GetSocketAddress(); sa.GetAddress() != host || sa.GetPortValue() != port {
		t.Errorf("cluster backend points at %s:%d, but listener backend is %s:%d", host, port, sa.GetAddress(), sa.GetPortValue())
	}
}

func TestPinnedEnvoyAcceptsConfig(t *testing.T) {
	bin := testenv.EnvoyBinary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("envoy --version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "/"+testenv.EnvoyVersion+"/") {
		t.Fatalf("envoy --version = %q, want version %s", out, testenv.EnvoyVersion)
	}
	if msg, ok := envoyValidate(t, envoyYAML(t)); !ok {
		t.Fatalf("envoy %s rejects envoy/envoy.yaml:\n%s", testenv.EnvoyVersion, msg)
	}
}

// envoyValidate runs `envoy --mode validate` on path.
func envoyValidate(t testing.TB, path string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.EnvoyBinary(t), "--mode", "validate", "-c", path, "-l", "critical", "--use-dynamic-base-id")
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

func TestEnvoyDescriptorsMatchDescriptorConfig(t *testing.T) {
	cfg := mustLoadEnvoy(t)
	for _, f := range []string{
		filepath.Join(repoRoot(t), "config", "edge.yaml"),
		filepath.Join(repoRoot(t), "e2e", "testdata", "config", "edge.yaml"),
	} {
		if err := crossCheckDescriptors(cfg, f); err != nil {
			t.Errorf("envoy/envoy.yaml against %s:\n%v", f, err)
		}
	}
	// The check itself: a descriptor file whose route value drifted.
	err := crossCheckDescriptors(cfg, filepath.Join("testdata", "descriptors-drift.yaml"))
	for _, want := range []string{
		"envoy sends descriptor [route=expensive remote_address=*], which no limit",
		"the limit on [route=expensiv, remote_address=*] is never reached",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("drifted descriptors: error %v, want it to contain %q", err, want)
		}
	}
}

func TestBrokenEnvoyConfigsFail(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
		// envoyRejects says whether Envoy itself refuses the file; our
		// checks must catch it either way.
		envoyRejects bool
	}{
		{
			file:         "envoy-misspelled.yaml",
			want:         []string{`unknown field "use_remote_adress"`, "envoy-misspelled.yaml:"},
			envoyRejects: true,
		},
		{
			file: "envoy-missing-cluster.yaml",
			// Envoy 1.36.4 --mode validate accepts this file: the
			// filter only fails when a request arrives (and then fails
			// open).
			want: []string{`names cluster "envoy-rls", which is not defined`},
		},
		{
			file: "envoy-no-http2.yaml",
			want: []string{`cluster "envoy_rls" carries gRPC but does not speak HTTP/2`},
		},
		{
			file: "envoy-invalid-value.yaml",
			want: []string{"bootstrap.static_resources.listeners[0]", "invalid HttpConnectionManager.StatPrefix"},
			// Envoy also validates these rules.
			envoyRejects: true,
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join("testdata", tc.file)
			_, err := loadEnvoyConfig(path)
			if err == nil {
				t.Fatalf("loadEnvoyConfig(%s) succeeded, want an error", path)
			}
			t.Logf("error (as a user sees it):\n%v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q", w)
				}
			}
			msg, ok := envoyValidate(t, path)
			if ok == tc.envoyRejects {
				t.Errorf("envoy --mode validate accepted=%v, want %v:\n%s", ok, !tc.envoyRejects, msg)
			}
		})
	}
}

// composeCheckFor returns the check of compose file file (relative to the
// repository root) against the shipped envoy.yaml and envoy-rls's flags.
func composeCheckFor(t *testing.T, file string) composeCheck {
	t.Helper()
	root := repoRoot(t)
	return composeCheck{
		ComposeFile:  filepath.Join(root, file),
		WorkingDir:   root,
		EnvoyFile:    envoyYAML(t),
		Envoy:        mustLoadEnvoy(t),
		EnvoyVersion: testenv.EnvoyVersion,
		Flags:        envoyRLSFlags(t),
	}
}

func TestComposeMatchesEnvoyAndFlags(t *testing.T) {
	c := composeCheckFor(t, "docker-compose.yml")
	c.Dockerfile = filepath.Join(c.WorkingDir, "Dockerfile")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := checkCompose(ctx, c); err != nil {
		t.Fatalf("docker-compose.yml:\n%v", err)
	}
	// The flags the compose file and the README rely on exist.
	for _, f := range []string{"config.dir", "grpc.addr", "http.addr", "debug.addr", "redis.url", "fallback.instances"} {
		if _, ok := c.Flags[f]; !ok {
			t.Errorf("envoy-rls serve has no --%s flag", f)
		}
	}
}

func TestBrokenComposeFilesFail(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
	}{
		{
			file: "compose-missing-mount.yml",
			want: []string{
				"service envoy mounts ./envoy/envoy.yml at /etc/envoy/envoy.yaml, which does not exist",
				"service envoy does not mount ./envoy/envoy.yaml",
			},
		},
		{
			file: "compose-wrong-port.yml",
			want: []string{
				`envoy.yaml's cluster "envoy_rls" points at envoy-rls:8081 but envoy-rls listens for gRPC on 8082`,
			},
		},
		{
			file: "compose-wrong-published-port.yml",
			want: []string{"service envoy-rls publishes container port 8082, but envoy-rls listens on 8081 (gRPC) and 9090 (HTTP)"},
		},
		{
			file: "compose-wrong-prometheus.yml",
			want: []string{"job envoy-rls scrapes envoy-rls:9091, but envoy-rls serves HTTP (/metrics) on port 9090"},
		},
		{
			file: "compose-unknown-env.yml",
			want: []string{"service envoy-rls sets ENVOY_RLS_REDIS_ADDR, which is no envoy-rls flag"},
		},
		{
			file: "compose-wrong-envoy-version.yml",
			want: []string{`service envoy uses image "envoyproxy/envoy:v1.35.0", want "envoyproxy/envoy:v1.36.4"`},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			c := composeCheckFor(t, filepath.Join("e2e", "testdata", tc.file))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := checkCompose(ctx, c)
			if err == nil {
				t.Fatalf("checkCompose(%s) succeeded, want an error", tc.file)
			}
			t.Logf("error (as a user sees it):\n%v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q", w)
				}
			}
		})
	}
}

// TestBuildsUseVTProtobuf checks that the recipes that build, vet, test or
// run envoy-rls pass the vtprotobuf build tag, without which the server's
// gRPC codec encodes responses by reflection (rls.Codec): the Dockerfile's
// and make bench's builds (rls-bench's do-nothing server uses the codec
// too), and every go command of the Makefile. The
// binary these tests run is checked by TestBinaryHasVTProtobuf.
func TestBuildsUseVTProtobuf(t *testing.T) {
	root := repoRoot(t)
	read := func(name string) []string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(string(b), "\n")
	}
	for _, name := range []string{"Dockerfile", filepath.Join("scripts", "bench.sh")} {
		builds := 0
		for i, line := range read(name) {
			if !strings.Contains(line, "go build") || !strings.Contains(line, "./cmd/") {
				continue
			}
			builds++
			if !strings.Contains(line, "-tags vtprotobuf") {
				t.Errorf("%s:%d: built without -tags vtprotobuf: %s", name, i+1, strings.TrimSpace(line))
			}
		}
		if builds == 0 {
			t.Errorf("%s: no go build of ./cmd/... found", name)
		}
	}
	tags, commands := false, 0
	for i, line := range read("Makefile") {
		if strings.HasPrefix(line, "GOTAGS ?= ") {
			tags = strings.Contains(line, "vtprotobuf")
		}
		for _, verb := range []string{"test", "vet", "build", "run"} {
			if strings.Contains(line, "$(GO) "+verb+" ") {
				commands++
				if !strings.Contains(line, `-tags "$(GOTAGS)"`) {
					t.Errorf("Makefile:%d: go %s without the build tags: %s", i+1, verb, strings.TrimSpace(line))
				}
			}
		}
	}
	if !tags || commands != 5 {
		t.Errorf("Makefile: GOTAGS defaults to vtprotobuf: %v; go test, vet (twice: Linux and darwin), build and run: %d of 5 found", tags, commands)
	}
}

// TestDockerfileImage: the build stage's Go image is the exact version
// go.mod asks for (the golang image sets GOTOOLCHAIN=local, so a cached
// golang:1.26 older than go.mod's patch release would fail the build, and a
// newer one would build with another Go than the tests ran), and the final
// stage runs as a numeric non-root user (Kubernetes' runAsNonRoot refuses a
// user name it cannot verify).
func TestDockerfileImage(t *testing.T) {
	root := repoRoot(t)
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for _, line := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(line, "go "); ok {
			goVersion = strings.TrimSpace(v)
		}
	}
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var from, user []string
	for _, line := range strings.Split(string(docker), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "FROM" {
			from = append(from, f[1])
		} else if len(f) > 1 && f[0] == "USER" {
			user = append(user, f[1])
		}
	}
	if goVersion == "" || len(from) == 0 || from[0] != "golang:"+goVersion {
		t.Errorf("Dockerfile builds FROM %v, go.mod asks for go %q: want golang:%s first", from, goVersion, goVersion)
	}
	if len(user) != 1 || user[0] != "65532:65532" {
		t.Errorf("Dockerfile USER %v, want 65532:65532 (distroless's nonroot, by number)", user)
	}
}
