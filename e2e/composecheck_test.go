package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"gopkg.in/yaml.v3"
)

// composeCheck is what checkCompose compares the compose file against.
type composeCheck struct {
	// ComposeFile is the compose file; WorkingDir resolves its relative
	// paths (the repository root for the shipped file and its fixtures).
	ComposeFile, WorkingDir string
	// EnvoyFile is the envoy.yaml the envoy service must mount, and Envoy
	// its decoded content.
	EnvoyFile string
	Envoy     *envoyConfig
	// EnvoyVersion is the pinned Envoy version the image tag must carry.
	EnvoyVersion string
	// Flags are the envoy-rls serve flags by name.
	Flags map[string]rlsFlag
	// Dockerfile, when set, has its ENVOY_RLS_* ENV lines checked too.
	Dockerfile string
}

// loadCompose loads a compose file with compose-go, without reading the
// process environment or .env files.
func loadCompose(ctx context.Context, file, workingDir string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithWorkingDirectory(workingDir),
		cli.WithDiscardEnvFile,
	)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	p, err := opts.LoadProject(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return p, nil
}

// checkCompose loads c.ComposeFile and reports every inconsistency with
// envoy.yaml, the Prometheus configuration it mounts and the envoy-rls flags.
func checkCompose(ctx context.Context, c composeCheck) error {
	p, err := loadCompose(ctx, c.ComposeFile, c.WorkingDir)
	if err != nil {
		return err
	}
	file := c.ComposeFile
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{file}, args...)...))
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range p.Services {
			if !yield(n) {
				return
			}
		}
	})

	// Every bind-mounted file or folder exists.
	for _, n := range names {
		for _, v := range p.Services[n].Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				fail("service %s mounts %s at %s, which does not exist", n, rel(c.WorkingDir, v.Source), v.Target)
			}
		}
	}

	// Every ENVOY_RLS_* variable is a flag of envoy-rls.
	known := map[string]bool{}
	for _, f := range c.Flags {
		known[f.Env] = true
	}
	for _, n := range names {
		for _, k := range slices.Sorted(mapKeys(p.Services[n].Environment)) {
			if strings.HasPrefix(k, "ENVOY_RLS_") && !known[k] {
				fail("service %s sets %s, which is no envoy-rls flag (see `envoy-rls serve -h`)", n, k)
			}
		}
	}
	if c.Dockerfile != "" {
		envs, err := dockerfileEnv(c.Dockerfile)
		if err != nil {
			errs = append(errs, err)
		}
		for _, k := range envs {
			if !known[k] {
				errs = append(errs, fmt.Errorf("%s: ENV %s is no envoy-rls flag", c.Dockerfile, k))
			}
		}
	}

	// The envoy service runs the pinned version with this envoy.yaml.
	envoySvc, ok := p.Services["envoy"]
	if !ok {
		fail("no service called envoy")
	} else {
		if want := "envoyproxy/envoy:v" + c.EnvoyVersion; envoySvc.Image != want {
			fail("service envoy uses image %q, want %q (the version the tests run)", envoySvc.Image, want)
		}
		target := ""
		for _, v := range envoySvc.Volumes {
			if v.Type == types.VolumeTypeBind && sameFile(v.Source, c.EnvoyFile) {
				target = v.Target
			}
		}
		if target == "" {
			fail("service envoy does not mount %s", rel(c.WorkingDir, c.EnvoyFile))
		} else if i := slices.Index(envoySvc.Command, "-c"); i < 0 || i+1 >= len(envoySvc.Command) || envoySvc.Command[i+1] != target {
			fail("service envoy's command %q does not run -c %s (where envoy.yaml is mounted)", envoySvc.Command, target)
		}
		ports := publishedTargets(envoySvc)
		for _, l := range c.Envoy.Bootstrap.GetStaticResources().GetListeners() {
			sa := l.GetAddress().GetSocketAddress()
			if sa.GetAddress() == "0.0.0.0" && !ports[sa.GetPortValue()] {
				fail("service envoy does not publish listener %q's port %d", l.GetName(), sa.GetPortValue())
			}
		}
	}

	// The envoy_rls cluster reaches the envoy-rls service's gRPC port.
	rlsCluster := c.Envoy.Cluster(c.Envoy.RateLimitCluster())
	var rlsName string
	var grpcPort, httpPort uint32
	if rlsCluster == nil {
		fail("envoy.yaml has no rate-limit cluster to compare with")
	} else {
		host, port, err := clusterAddress(rlsCluster)
		if err != nil {
			errs = append(errs, err)
		}
		svc, ok := p.Services[host]
		if !ok {
			fail("envoy.yaml's cluster %q points at host %q, which is no service (services: %s)", rlsCluster.GetName(), host, strings.Join(names, ", "))
		} else {
			rlsName = host
			grpcPort, err = listenPort(svc, c.Flags, "grpc.addr")
			if err != nil {
				fail("service %s: %v", host, err)
			}
			httpPort, err = listenPort(svc, c.Flags, "http.addr")
			if err != nil {
				fail("service %s: %v", host, err)
			}
			if grpcPort != 0 && port != grpcPort {
				fail("envoy.yaml's cluster %q points at %s:%d but envoy-rls listens for gRPC on %d", rlsCluster.GetName(), host, port, grpcPort)
			}
			for target := range publishedTargets(svc) {
				if target != grpcPort && target != httpPort {
					fail("service %s publishes container port %d, but envoy-rls listens on %d (gRPC) and %d (HTTP)", host, target, grpcPort, httpPort)
				}
			}
			errs = append(errs, checkRedisURL(file, p, host, svc)...)
		}
	}

	// Prometheus scrapes envoy-rls on its HTTP port.
	if rlsName != "" && httpPort != 0 {
		errs = append(errs, checkPrometheus(file, p, names, rlsName, httpPort)...)
	}
	return errors.Join(errs...)
}

// listenPort returns the port of the envoy-rls listen address flag (from the
// service's environment or command line, else the flag's default).
func listenPort(svc types.ServiceConfig, flags map[string]rlsFlag, flag string) (uint32, error) {
	f, ok := flags[flag]
	if !ok {
		return 0, fmt.Errorf("envoy-rls has no --%s flag", flag)
	}
	addr := f.Default
	if v, ok := svc.Environment[f.Env]; ok && v != nil {
		addr = *v
	}
	for i, a := range svc.Command {
		if a == "--"+flag && i+1 < len(svc.Command) {
			addr = svc.Command[i+1]
		} else if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			addr = v
		}
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("--%s=%q: %w", flag, addr, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("--%s=%q: %w", flag, addr, err)
	}
	return uint32(n), nil
}

// checkRedisURL checks that ENVOY_RLS_REDIS_URL names a Redis service and its
// port.
func checkRedisURL(file string, p *types.Project, name string, svc types.ServiceConfig) []error {
	v, ok := svc.Environment["ENVOY_RLS_REDIS_URL"]
	if !ok || v == nil {
		return nil
	}
	u, err := url.Parse(*v)
	if err != nil {
		return []error{fmt.Errorf("%s: service %s: ENVOY_RLS_REDIS_URL: %w", file, name, err)}
	}
	redisSvc, ok := p.Services[u.Hostname()]
	if !ok {
		return []error{fmt.Errorf("%s: service %s: ENVOY_RLS_REDIS_URL points at host %q, which is no service", file, name, u.Hostname())}
	}
	if !strings.HasPrefix(redisSvc.Image, "redis:") {
		return []error{fmt.Errorf("%s: service %s: ENVOY_RLS_REDIS_URL points at service %s, whose image %q is not redis", file, name, u.Hostname(), redisSvc.Image)}
	}
	if port := u.Port(); port != "" && port != "6379" {
		return []error{fmt.Errorf("%s: service %s: ENVOY_RLS_REDIS_URL uses port %s, but redis listens on 6379", file, name, port)}
	}
	if _, ok := svc.DependsOn[u.Hostname()]; !ok {
		return []error{fmt.Errorf("%s: service %s does not depend on %s", file, name, u.Hostname())}
	}
	return nil
}

// prometheusConfig is the part of prometheus.yml the check reads.
type prometheusConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// checkPrometheus finds the service that mounts a prometheus.yml and checks
// that it scrapes rlsName's /metrics on httpPort.
func checkPrometheus(file string, p *types.Project, names []string, rlsName string, httpPort uint32) []error {
	var promFile string
	for _, n := range names {
		for _, v := range p.Services[n].Volumes {
			if v.Type == types.VolumeTypeBind && strings.HasSuffix(v.Target, "/prometheus.yml") {
				promFile = v.Source
			}
		}
	}
	if promFile == "" {
		return []error{fmt.Errorf("%s: no service mounts a prometheus.yml", file)}
	}
	src, err := os.ReadFile(promFile)
	if err != nil {
		return nil // reported as a missing mount
	}
	var pc prometheusConfig
	if err := yaml.Unmarshal(src, &pc); err != nil {
		return []error{fmt.Errorf("%s: %w", promFile, err)}
	}
	var errs []error
	scraped := false
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, err := net.SplitHostPort(target)
				if err != nil || host != rlsName {
					continue
				}
				scraped = true
				if port != strconv.Itoa(int(httpPort)) {
					errs = append(errs, fmt.Errorf("%s: job %s scrapes %s, but envoy-rls serves HTTP (/metrics) on port %d", promFile, sc.JobName, target, httpPort))
				}
				if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
					errs = append(errs, fmt.Errorf("%s: job %s scrapes %s%s, but envoy-rls serves /metrics", promFile, sc.JobName, target, sc.MetricsPath))
				}
			}
		}
	}
	if !scraped {
		errs = append(errs, fmt.Errorf("%s: no job scrapes %s:%d", promFile, rlsName, httpPort))
	}
	return errs
}

// dockerfileEnv returns the ENVOY_RLS_* variables a Dockerfile sets with ENV.
func dockerfileEnv(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.EqualFold(fields[0], "ENV") {
			continue
		}
		for _, kv := range fields[1:] {
			k, _, _ := strings.Cut(kv, "=")
			if strings.HasPrefix(k, "ENVOY_RLS_") {
				out = append(out, k)
			}
		}
	}
	return out, sc.Err()
}

// publishedTargets returns the container ports a service publishes.
func publishedTargets(svc types.ServiceConfig) map[uint32]bool {
	out := map[uint32]bool{}
	for _, p := range svc.Ports {
		out[p.Target] = true
	}
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !yield(k) {
				return
			}
		}
	}
}

func sameFile(a, b string) bool {
	aa, err1 := filepath.Abs(a)
	bb, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == bb
}

func rel(base, path string) string {
	if r, err := filepath.Rel(base, path); err == nil && !strings.HasPrefix(r, "..") {
		return "./" + r
	}
	return path
}
