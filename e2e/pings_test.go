package e2e

import (
	"net/http"
	"testing"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestNoPingsBetweenEnvoyAndEnvoyRLS: on the connection from the shipped
// Envoy config to envoy-rls neither side sends a PING while requests are
// decided. Envoy keeps fixed HTTP/2 windows; envoy-rls's default
// --grpc.conn-window does too. With --grpc.conn-window 0, grpc-go's BDP
// estimation, envoy-rls sends PINGs that Envoy has to answer: the case that
// shows the count can see them. Envoy is stopped before the count, so every
// byte it sent has gone through the proxy.
func TestNoPingsBetweenEnvoyAndEnvoyRLS(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		wantPings bool
	}{
		{name: "default", wantPings: false},
		{name: "conn-window=0", args: []string{"--grpc.conn-window", "0"}, wantPings: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRLS(t, rlsOptions{Args: tc.args})
			tap := testenv.StartTapProxy(t, r.GRPCAddr)
			e := startEnvoy(t, tap.Addr())
			for i := 1; i <= perIP; i++ {
				if got := get(t, e.URL, "/"); got.Status != http.StatusOK {
					t.Fatalf("request %d: %v, want 200", i, got)
				}
			}
			if got := get(t, e.URL, "/"); got.Status != http.StatusTooManyRequests {
				t.Fatalf("request %d: %v, want 429: the requests were not decided by envoy-rls", perIP+1, got)
			}
			e.Stop()
			fromEnvoy, fromRLS := tap.H2Frames(t)
			if fromEnvoy.Pings != 0 {
				t.Errorf("Envoy sent %d PINGs to envoy-rls over %d requests, want none", fromEnvoy.Pings, perIP+1)
			}
			if (fromRLS.Pings > 0) != tc.wantPings {
				t.Errorf("envoy-rls %v sent %d PINGs over %d requests; want PINGs: %v", tc.args, fromRLS.Pings, perIP+1, tc.wantPings)
			}
		})
	}
}
