package testenv

import (
	"net"
	"strconv"
	"testing"
)

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
