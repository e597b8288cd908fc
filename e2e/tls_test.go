package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// readmeTLSHeading is the README section whose YAML block is the envoy_rls
// cluster's transport socket for mutual TLS.
const readmeTLSHeading = "### Over TLS, with client certificates"

// readmeTransportSocket returns the transport_socket the README shows for
// Envoy to reach envoy-rls over mutual TLS, with its example paths and
// server name replaced by f's files and the name in f's server
// certificate (localhost).
func readmeTransportSocket(t *testing.T, f *testenv.TLSFiles) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+readmeTLSHeading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", readmeTLSHeading)
	}
	_, block, ok := strings.Cut(section, "\n```yaml\n")
	if !ok {
		t.Fatalf("README.md's section %q has no yaml block", readmeTLSHeading)
	}
	block, _, _ = strings.Cut(block, "\n```")
	replaced := strings.NewReplacer(
		"/etc/envoy/tls/client.crt", f.ClientCert,
		"/etc/envoy/tls/client.key", f.ClientKey,
		"/etc/envoy/tls/ca.crt", f.CA,
		"envoy-rls.internal", "localhost",
	).Replace(block)
	if replaced == block {
		t.Fatalf("README.md's transport socket names none of the example paths:\n%s", block)
	}
	var doc struct {
		TransportSocket map[string]any `yaml:"transport_socket"`
	}
	dec := yaml.NewDecoder(strings.NewReader(replaced))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil || doc.TransportSocket == nil {
		t.Fatalf("README.md's transport socket: %v:\n%s", err, block)
	}
	return doc.TransportSocket
}

// TestThroughEnvoyOverMutualTLS: Envoy with the README's transport socket
// reaches envoy-rls serving mutual TLS with the README's flags (paths and
// names replaced): the per-IP limit holds exactly, the cluster's
// connections are TLS, and envoy-rls refused no handshake.
func TestThroughEnvoyOverMutualTLS(t *testing.T) {
	f := testenv.NewTLSFiles(t)
	redis := testenv.RedisServer(t)
	r := startRLS(t, rlsOptions{Redis: redis.Addr, Args: []string{
		"--grpc.tls.cert", f.Cert, "--grpc.tls.key", f.Key,
		"--grpc.tls.client-ca", f.CA, "--grpc.tls.client-san", "client",
	}})
	e := startEnvoyTLS(t, r.GRPCAddr, readmeTransportSocket(t, f))
	for i := 1; i <= perIP; i++ {
		checkOK(t, get(t, e.URL, "/"), "per_ip", perIP, perIP-i)
	}
	checkLimited(t, get(t, e.URL, "/"), "per_ip", perIP)
	if n := envoyStat(t, e, "cluster.envoy_rls.ssl.handshake"); n < 1 {
		t.Errorf("cluster.envoy_rls.ssl.handshake = %d, want the connection to envoy-rls on TLS", n)
	}
	if v := rlsMetric(t, r, "envoy_rls_grpc_tls_handshake_failures_total"); v != "0" {
		t.Errorf("envoy_rls_grpc_tls_handshake_failures_total = %s, want 0", v)
	}
}
