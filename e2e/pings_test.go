package e2e

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"golang.org/x/net/http2"
)

// tapProxy forwards TCP connections from its listener to a target and keeps
// a copy of what went each way on each connection.
type tapProxy struct {
	lis    net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and every copy
	mu     sync.Mutex
	conns  []*tapConn
}

// tapConn is what one connection carried: up from the client, down from the
// server. done ends when both copies have ended.
type tapConn struct {
	up, down bytes.Buffer
	done     sync.WaitGroup
}

// startTapProxy listens on a free loopback port and forwards to target
// until the test ends.
func startTapProxy(t *testing.T, target string) *tapProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tapProxy{lis: lis, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tapProxy) Addr() string { return p.lis.Addr().String() }

func (p *tapProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		tc := &tapConn{}
		p.mu.Lock()
		p.conns = append(p.conns, tc)
		p.mu.Unlock()
		p.wg.Add(2)
		tc.done.Add(2)
		go p.pipe(s, c, &tc.up, &tc.done)
		go p.pipe(c, s, &tc.down, &tc.done)
	}
}

// pipe copies src to dst, recording each chunk before it forwards it, until
// either side closes; then it closes both.
func (p *tapProxy) pipe(dst, src net.Conn, rec *bytes.Buffer, done *sync.WaitGroup) {
	defer p.wg.Done()
	defer done.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			rec.Write(buf[:n])
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tapProxy) close() {
	p.lis.Close()
	p.wg.Wait()
}

// pings waits until every connection has closed (the client is gone), then
// counts the PING frames that are not acks in the recorded HTTP/2 bytes of
// each direction, over every connection.
func (p *tapProxy) pings(t *testing.T) (fromClient, fromServer int) {
	t.Helper()
	p.mu.Lock()
	conns := p.conns
	p.mu.Unlock()
	if len(conns) == 0 {
		t.Fatal("no connection went through the proxy")
	}
	for _, c := range conns {
		c.done.Wait()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		up := c.up.Bytes()
		if !bytes.HasPrefix(up, []byte(http2.ClientPreface)) {
			t.Fatalf("a connection did not start with the HTTP/2 client preface")
		}
		fromClient += countPings(t, up[len(http2.ClientPreface):])
		fromServer += countPings(t, c.down.Bytes())
	}
	return fromClient, fromServer
}

func countPings(t *testing.T, frames []byte) int {
	t.Helper()
	fr := http2.NewFramer(nil, bytes.NewReader(frames))
	n := 0
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n // the end, or a frame cut by the close
		}
		if err != nil {
			t.Fatalf("parsing recorded HTTP/2 frames: %v", err)
		}
		if pf, ok := f.(*http2.PingFrame); ok && !pf.IsAck() {
			n++
		}
	}
}

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
			tap := startTapProxy(t, r.GRPCAddr)
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
			fromEnvoy, fromRLS := tap.pings(t)
			if fromEnvoy != 0 {
				t.Errorf("Envoy sent %d PINGs to envoy-rls over %d requests, want none", fromEnvoy, perIP+1)
			}
			if (fromRLS > 0) != tc.wantPings {
				t.Errorf("envoy-rls %v sent %d PINGs over %d requests; want PINGs: %v", tc.args, fromRLS, perIP+1, tc.wantPings)
			}
		})
	}
}
