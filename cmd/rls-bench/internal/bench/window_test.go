package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestConnWindowSparesClientPings: with a fixed ConnWindow the generator
// grants the server that window once and sends no PING, as Envoy does; with
// 0 it keeps grpc-go's dynamic windows and sends BDP PINGs on responses.
func TestConnWindowSparesClientPings(t *testing.T) {
	for _, tc := range []struct {
		window       int
		wantPings    bool
		wantIncrease uint32
	}{
		{window: 1 << 20, wantPings: false, wantIncrease: 1<<20 - 65535},
		{window: 0, wantPings: true},
	} {
		tap := testenv.StartTapProxy(t, serveRLS(t, noopService{}))
		res, err := Run(context.Background(), Options{
			Addr:        tap.Addr(),
			Connections: 1,
			Concurrency: 1,
			Requests:    50,
			ConnWindow:  tc.window,
			Descriptors: mustTemplates(t, "remote_address=10.0.{i}"),
			Timeout:     time.Minute,
		})
		if err != nil {
			t.Fatalf("Run with ConnWindow %d: %v", tc.window, err)
		}
		if res.OK != 50 {
			t.Errorf("ConnWindow %d: %d OK answers, want 50", tc.window, res.OK)
		}
		// Run closed its connections: H2Frames has every byte they carried.
		fromClient, _ := tap.H2Frames(t)
		if (fromClient.Pings > 0) != tc.wantPings {
			t.Errorf("ConnWindow %d: the client sent %d PINGs over 50 calls; want PINGs: %v", tc.window, fromClient.Pings, tc.wantPings)
		}
		if tc.wantIncrease != 0 && fromClient.ConnIncrease != tc.wantIncrease {
			t.Errorf("ConnWindow %d: the client raised the connection window by %d, want %d", tc.window, fromClient.ConnIncrease, tc.wantIncrease)
		}
	}
}

// TestConnWindowBelowHTTP2MinimumIsRefused: grpc-go would ignore it; the
// error names the flag.
func TestConnWindowBelowHTTP2MinimumIsRefused(t *testing.T) {
	for _, w := range []int{-1, 1000, 65534} {
		_, err := Run(context.Background(), Options{Addr: "127.0.0.1:1", ConnWindow: w, Descriptors: mustTemplates(t, "a=b")})
		if err == nil || !strings.Contains(err.Error(), "--conn-window") {
			t.Errorf("ConnWindow %d: %v, want an error naming --conn-window", w, err)
		}
	}
}
