package testenv

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
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

// FreePort returns a TCP port on 127.0.0.1 that was free when it was chosen.
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func loopbackAddr(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
