// Package e2e holds the checks that tie the deployment files to each other and
// to the running system. It has no exported API; everything is in its tests.
//
// static_test.go decodes envoy/envoy.yaml strictly into go-control-plane's
// Bootstrap (every typed_config unpacked and validated), asks the pinned
// Envoy binary to validate it, cross-checks the descriptors it produces
// against config/edge.yaml, and loads docker-compose.yml with compose-go to
// check it against envoy.yaml, the Prometheus config and the flags of the
// envoy-rls binary. Broken fixtures in testdata/ must fail the same checks.
//
// e2e_test.go starts real processes on loopback: redis-server, envoy-rls
// (built from ./cmd/envoy-rls) and Envoy running envoy/envoy.yaml with its
// addresses rewritten to free ports, and sends plain HTTP requests through
// Envoy.
//
// Run with `go test ./e2e/` from the repository root (`make test` installs
// redis-server and Envoy).
package e2e
