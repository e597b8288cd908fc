package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/rls"
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// h2Exchange is what the server sent on a raw HTTP/2 connection while it
// answered one ShouldRateLimit call.
type h2Exchange struct {
	pings        int    // PING frames that are not acks
	connIncrease uint32 // sum of the connection's WINDOW_UPDATE increments
	grpcStatus   string // from the call's trailers
}

// oneRawCall sends one ShouldRateLimit call on a fresh HTTP/2 connection,
// frame by frame as Envoy's codec would, and reads every frame the server
// writes until the call's trailers.
func oneRawCall(t *testing.T, addr string, req *rlsv3.RateLimitRequest) h2Exchange {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))) // uncompressed, length
	if err := fr.WriteData(1, true, append(body, msg...)); err != nil {
		t.Fatal(err)
	}

	var x h2Exchange
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == "grpc-status" {
			x.grpcStatus = f.Value
		}
	})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's frames: %v (so far %+v)", err, x)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				x.pings++
				if err := fr.WritePing(true, f.Data); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				x.connIncrease += f.Increment
			}
		case *http2.HeadersFrame:
			if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
				t.Fatal(err)
			}
			if f.StreamEnded() {
				return x
			}
		}
	}
}

// TestConnWindowSparesBDPPings: with the default --grpc.conn-window the
// server announces a fixed connection window of that size and sends no
// PING while it answers a call; with 0 (grpc-go's dynamic windows) it sends
// a BDP PING for the call's data, which the client must answer. grpc-go
// queues that PING before it hands the data to the call, so it always
// precedes the trailers.
func TestConnWindowSparesBDPPings(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "w.yaml"), "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	req := &rlsv3.RateLimitRequest{Domain: "w", Descriptors: []*commonrl.RateLimitDescriptor{desc("k", "v")}}
	for _, tc := range []struct {
		window       int
		wantPings    bool
		wantIncrease uint32
	}{
		{window: defaultConnWindow, wantPings: false, wantIncrease: defaultConnWindow - 65535},
		{window: 0, wantPings: true},
	} {
		r := startServe(t, serveOptions{configDir: dir, grpcWindow: tc.window})
		x := oneRawCall(t, r.addrs.GRPC, req)
		if x.grpcStatus != "0" {
			t.Errorf("--grpc.conn-window %d: grpc-status %q, want 0", tc.window, x.grpcStatus)
		}
		if (x.pings > 0) != tc.wantPings {
			t.Errorf("--grpc.conn-window %d: the server sent %d PINGs for one call; want PINGs: %v", tc.window, x.pings, tc.wantPings)
		}
		if tc.wantIncrease != 0 && x.connIncrease != tc.wantIncrease {
			t.Errorf("--grpc.conn-window %d: connection window raised by %d, want %d", tc.window, x.connIncrease, tc.wantIncrease)
		}
	}
}

// TestLargestValidRequestFlowsThroughFixedWindows: with the default fixed
// windows (64 KiB per stream, 1 MiB per connection) a request of the largest
// size the request limits allow, over 1 MiB, still arrives whole and is
// answered: the server replenishes the windows as it reads.
func TestLargestValidRequestFlowsThroughFixedWindows(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "w.yaml"), "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	r := startServe(t, serveOptions{configDir: dir, grpcWindow: defaultConnWindow})
	req := &rlsv3.RateLimitRequest{Domain: "w"}
	for d := range rls.DefaultMaxDescriptors {
		var kv []string
		for e := range rls.DefaultMaxEntries {
			kv = append(kv, fmt.Sprintf("%0*d", rls.DefaultMaxKeyBytes, d*100+e), strings.Repeat("v", rls.DefaultMaxValueBytes))
		}
		req.Descriptors = append(req.Descriptors, desc(kv...))
	}
	if n := proto.Size(req); n <= defaultConnWindow {
		t.Fatalf("request of %d bytes: want more than the %d-byte window", n, defaultConnWindow)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := r.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit of %d bytes: %v", proto.Size(req), err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != rls.DefaultMaxDescriptors {
		t.Errorf("answer %v with %d statuses, want OK with %d", resp.GetOverallCode(), len(resp.GetStatuses()), rls.DefaultMaxDescriptors)
	}
}
