package testenv

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
)

// TapProxy forwards TCP connections from a free loopback port to a target
// and keeps a copy of what went each way on each connection, for tests that
// check what an HTTP/2 peer sent on the wire (H2Frames).
type TapProxy struct {
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

// StartTapProxy listens on a free loopback port and forwards to target until
// the test ends.
func StartTapProxy(t testing.TB, target string) *TapProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: tap proxy: %v", err)
	}
	p := &TapProxy{lis: lis, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		p.lis.Close()
		p.wg.Wait()
	})
	return p
}

// Addr is the address clients connect to.
func (p *TapProxy) Addr() string { return p.lis.Addr().String() }

func (p *TapProxy) accept() {
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
		tc.done.Add(2)
		p.wg.Go(func() { p.pipe(s, c, &tc.up, &tc.done) })
		p.wg.Go(func() { p.pipe(c, s, &tc.down, &tc.done) })
	}
}

// pipe copies src to dst, recording each chunk before it forwards it, until
// either side closes; then it closes both.
func (p *TapProxy) pipe(dst, src net.Conn, rec *bytes.Buffer, done *sync.WaitGroup) {
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

// H2Frames is what one side of HTTP/2 connections sent, over every
// connection: its PING frames that are not acks, and the increments of its
// connection-level WINDOW_UPDATEs.
type H2Frames struct {
	Pings        int
	ConnIncrease uint32
}

// H2Frames waits until every connection through the proxy has closed (its
// client is gone), then parses the recorded bytes as HTTP/2 and returns
// what the clients and the servers sent. It fails the test when no
// connection went through or the bytes are not HTTP/2.
func (p *TapProxy) H2Frames(t testing.TB) (fromClients, fromServers H2Frames) {
	t.Helper()
	p.mu.Lock()
	conns := p.conns
	p.mu.Unlock()
	if len(conns) == 0 {
		t.Fatal("testenv: no connection went through the tap proxy")
	}
	for _, c := range conns {
		c.done.Wait()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		up := c.up.Bytes()
		if !bytes.HasPrefix(up, []byte(http2.ClientPreface)) {
			t.Fatal("testenv: a connection through the tap proxy did not start with the HTTP/2 client preface")
		}
		addFrames(t, &fromClients, up[len(http2.ClientPreface):])
		addFrames(t, &fromServers, c.down.Bytes())
	}
	return fromClients, fromServers
}

// addFrames adds what the HTTP/2 frames in b hold to f.
func addFrames(t testing.TB, f *H2Frames, b []byte) {
	t.Helper()
	fr := http2.NewFramer(nil, bytes.NewReader(b))
	for {
		frame, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return // the end, or a frame cut by the close
		}
		if err != nil {
			t.Fatalf("testenv: parsing recorded HTTP/2 frames: %v", err)
		}
		switch frame := frame.(type) {
		case *http2.PingFrame:
			if !frame.IsAck() {
				f.Pings++
			}
		case *http2.WindowUpdateFrame:
			if frame.StreamID == 0 {
				f.ConnIncrease += frame.Increment
			}
		}
	}
}
