package testenv

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// SocketPath returns the path name in a fresh directory, removed when the
// test ends, for a Unix socket. The directory is short, under the system's
// temporary directory: a socket's path holds at most 107 bytes (sun_path),
// which t.TempDir(), named after a long test, could exceed.
func SocketPath(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rls-sock-")
	if err != nil {
		t.Fatalf("testenv: directory for a Unix socket: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name)
}

// FreePort returns a TCP port on 127.0.0.1 that was free when it was chosen,
// and that it has not returned before in this process.
// The port is released before FreePort returns, so another process may take it
// in the meantime; the server starters retry with a new port when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: find a free port: %v", err)
	}
	return port
}

// FreeAddr returns "127.0.0.1:<port>" for a port chosen as by FreePort.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return loopbackAddr(FreePort(t))
}

// handedOut are the ports freePort returned in this process. The kernel
// may offer a port it just released again at once, and two servers of one
// test given the same port (Envoy's listeners, say) cannot both listen.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// freePort returns a free port on loopback that it has not returned before
// in this process.
func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = make(map[int]bool)
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("100 ports in a row were ones already handed out")
}

func loopbackAddr(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
