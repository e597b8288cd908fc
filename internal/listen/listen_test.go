package listen

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

func TestUnixPath(t *testing.T) {
	long := "/" + strings.Repeat("d", MaxPath)
	for _, c := range []struct {
		addr, path string
		err        string // a substring of the error; "" for none
	}{
		{"unix:///run/rls.sock", "/run/rls.sock", ""},
		{"unix:/run/rls.sock", "/run/rls.sock", ""},
		{"unix:rls.sock", "rls.sock", ""},
		{"unix:" + long[:MaxPath], long[:MaxPath], ""},
		{"unix:" + long, "", "longer than a Unix socket address holds"},
		{"unix:", "", "empty Unix socket path"},
		{"unix://", "", "names a host"},
		{"unix://run/rls.sock", "", "names a host"},
		{"unix:@rls", "", "abstract sockets"},
		{"unix:/run/rls?.sock", "", "'?', '#' or '%'"},
		{"unix:/run/rls%41.sock", "", "'?', '#' or '%'"},
		{":8081", "", "no unix: address"},
		// The socket is made first in dir/.rls-<8 hex digits>/s, 16 bytes
		// longer than dir: the longest directory that leaves room, and one
		// byte more.
		{"unix:" + long[:MaxPath-16] + "/s.sock", long[:MaxPath-16] + "/s.sock", ""},
		{"unix:" + long[:MaxPath-15] + "/s", "", "its directory's path is 92 bytes, and the socket is made first in a private folder there, 16 bytes more"},
	} {
		path, err := UnixPath(c.addr)
		if path != c.path || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("UnixPath(%q) = %q, %v; want %q, error with %q", c.addr, path, err, c.path, c.err)
		}
		if !IsUnix(c.addr) != (c.addr == ":8081") {
			t.Errorf("IsUnix(%q) = %v", c.addr, IsUnix(c.addr))
		}
	}
}

// TestListenAtTheLongestDirectory: a socket in a directory as long as
// UnixPath allows is made every time. The private folder it is made in first
// had a name of 1 to 10 random digits, so that such a path failed or not
// from one start to the next (a review's finding: 34 of 40 failed at 97
// bytes).
func TestListenAtTheLongestDirectory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, strings.Repeat("d", MaxPath-16-len(base)-1))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := "unix:" + filepath.Join(dir, "s")
	if _, err := UnixPath(addr); err != nil || len(dir) != MaxPath-16 {
		t.Fatalf("UnixPath(%d-byte directory) = %v", len(dir), err)
	}
	for i := range 20 {
		l, err := Listen(context.Background(), addr, 0o600)
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		l.Close()
	}
}

// socketPath is a socket path in a fresh, short directory.
func socketPath(t *testing.T) string { return testenv.SocketPath(t, "s.sock") }

// TestListenUnix: a "unix:" address listens on that socket with the mode
// asked for (not the umask's), accepts, and removes the file on Close.
func TestListenUnix(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []fs.FileMode{0o600, DefaultMode} {
		path := socketPath(t)
		l, err := Listen(ctx, "unix://"+path, mode)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		t.Cleanup(func() { l.Close() })
		if l.Addr().String() != path || Target(l.Addr()) != "unix:"+path {
			t.Errorf("Addr() = %q, target %q; want %q, unix:%s", l.Addr(), Target(l.Addr()), path, path)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want a socket with %v", path, fi.Mode(), mode)
		}
		accepted := make(chan error, 1)
		go func() {
			c, err := l.Accept()
			if err == nil {
				c.Close()
			}
			accepted <- err
		}()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial the socket: %v", err)
		}
		c.Close()
		if err := <-accepted; err != nil {
			t.Fatalf("Accept: %v", err)
		}
		l.Close()
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("after Close, %s: %v; want it removed", path, err)
		}
	}
}

// TestListenSocketFileLeftBehind: a socket file whose server is gone (a
// crash) is replaced; one a server accepts on, or a file that is no socket,
// is refused and left alone.
func TestListenSocketFileLeftBehind(t *testing.T) {
	ctx := context.Background()

	stale := socketPath(t)
	old, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	old.(*net.UnixListener).SetUnlinkOnClose(false) // as a crash leaves it
	old.Close()
	l, err := Listen(ctx, "unix:"+stale, DefaultMode)
	if err != nil {
		t.Fatalf("Listen over a stale socket file: %v", err)
	}

	if _, err := Listen(ctx, "unix:"+stale, DefaultMode); err == nil || !strings.Contains(err.Error(), "another process is listening") {
		t.Errorf("Listen on a socket in use: %v, want an error saying another process listens", err)
	}
	if _, err := os.Lstat(stale); err != nil {
		t.Errorf("the socket in use was removed: %v", err)
	}
	l.Close()

	file := socketPath(t)
	if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(ctx, "unix:"+file, DefaultMode); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Listen on a regular file: %v, want an error saying it is not a socket", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "data" {
		t.Errorf("the regular file was touched: %q, %v", b, err)
	}
}

// TestListenLeavesOnlyItsSocket: the private directory the socket is made
// in is gone once Listen returns, and Close does not remove a socket file
// that has replaced its own since (another server's).
func TestListenLeavesOnlyItsSocket(t *testing.T) {
	path := socketPath(t)
	l, err := Listen(context.Background(), "unix:"+path, DefaultMode)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(entries) != 1 || entries[0].Name() != filepath.Base(path) {
		t.Errorf("the socket's directory holds %v (%v), want the socket alone", entries, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Errorf("Close removed the socket that had replaced its own: %v", err)
	}
}

func TestListenRefuses(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		addr string
		mode fs.FileMode
		want string
	}{
		{"unix:", DefaultMode, "empty Unix socket path"},
		{"unix:" + socketPath(t), fs.ModeSetuid | 0o777, "want permission bits"},
		{"unix:" + socketPath(t), 0, "want permission bits"},
		{"unix:" + socketPath(t), 0o466, "want permission bits"},
	} {
		if l, err := Listen(ctx, c.addr, c.mode); err == nil || !strings.Contains(err.Error(), c.want) {
			if l != nil {
				l.Close()
			}
			t.Errorf("Listen(%q, %v): %v, want an error with %q", c.addr, c.mode, err, c.want)
		}
	}
}

func TestListenTCP(t *testing.T) {
	l, err := Listen(context.Background(), "127.0.0.1:0", DefaultMode)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Addr().Network() != "tcp" || Target(l.Addr()) != l.Addr().String() {
		t.Errorf("Listen(127.0.0.1:0) on %s, target %q; want tcp, host:port", l.Addr().Network(), Target(l.Addr()))
	}
}

func TestMode(t *testing.T) {
	m := Mode(DefaultMode)
	if got := m.String(); got != "0666" {
		t.Errorf("String() = %q, want 0666", got)
	}
	for _, c := range []struct {
		in   string
		want fs.FileMode
		ok   bool
	}{
		{"0660", 0o660, true},
		{"600", 0o600, true},
		{"0777", 0o777, true},
		{"01777", 0, false},
		{"0", 0, false},
		{"0466", 0, false},
		{"0668", 0, false},
		{"rw-rw----", 0, false},
		{"", 0, false},
	} {
		var m Mode
		err := m.Set(c.in)
		if (err == nil) != c.ok || (c.ok && fs.FileMode(m) != c.want) {
			t.Errorf("Set(%q) = %v, mode %#o; want ok=%v, %#o", c.in, err, uint32(m), c.ok, uint32(c.want))
		}
	}
}
