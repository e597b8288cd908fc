package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
)

// recordingListener keeps a copy of every byte its connections read: what
// the client sent, in order, per connection.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*bytes.Buffer
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := &bytes.Buffer{}
	l.conns = append(l.conns, buf)
	return &recordingConn{Conn: c, l: l, buf: buf}, nil
}

type recordingConn struct {
	net.Conn
	l   *recordingListener
	buf *bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	c.buf.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}

// clientFrames counts, over every recorded connection, the PINGs the client
// sent that were not acks and the increments of its connection-level
// WINDOW_UPDATEs.
func (l *recordingListener) clientFrames(t *testing.T) (pings int, connIncrease uint32) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.conns {
		data := b.Bytes()
		if !bytes.HasPrefix(data, []byte(http2.ClientPreface)) {
			t.Fatalf("a connection did not start with the HTTP/2 preface")
		}
		fr := http2.NewFramer(nil, bytes.NewReader(data[len(http2.ClientPreface):]))
		for {
			f, err := fr.ReadFrame()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("parsing the client's frames: %v", err)
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				if !f.IsAck() {
					pings++
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					connIncrease += f.Increment
				}
			}
		}
	}
	return pings, connIncrease
}

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
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis := &recordingListener{Listener: inner}
		srv := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(srv, noopService{})
		done := make(chan error, 1)
		go func() { done <- srv.Serve(lis) }()
		res, err := Run(context.Background(), Options{
			Addr:        inner.Addr().String(),
			Connections: 1,
			Concurrency: 1,
			Requests:    50,
			ConnWindow:  tc.window,
			Descriptors: mustTemplates(t, "remote_address=10.0.{i}"),
			Timeout:     time.Minute,
		})
		srv.Stop() // closes the connection: every byte the client sent is recorded
		if serr := <-done; serr != nil {
			t.Errorf("server: %v", serr)
		}
		if err != nil {
			t.Fatalf("Run with ConnWindow %d: %v", tc.window, err)
		}
		if res.OK != 50 {
			t.Errorf("ConnWindow %d: %d OK answers, want 50", tc.window, res.OK)
		}
		pings, inc := lis.clientFrames(t)
		if (pings > 0) != tc.wantPings {
			t.Errorf("ConnWindow %d: the client sent %d PINGs over 50 calls; want PINGs: %v", tc.window, pings, tc.wantPings)
		}
		if tc.wantIncrease != 0 && inc != tc.wantIncrease {
			t.Errorf("ConnWindow %d: the client raised the connection window by %d, want %d", tc.window, inc, tc.wantIncrease)
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
