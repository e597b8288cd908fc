// Package listen opens a server's listener on a TCP address or on a Unix
// socket, for the commands of this module that serve gRPC.
//
// An address "unix:PATH" (or gRPC's "unix:///abs/path") is a Unix socket:
// for a client on the same host (Envoy beside envoy-rls, a benchmark) it
// spares the TCP stack that a loopback connection goes through twice per
// request and answer. Anything else is a TCP "host:port".
package listen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultMode is the permission of a Unix socket unless the caller sets
// one: any local user may connect, as any local user may connect to a TCP
// port on loopback. A group-only mode (0660) with a group shared with the
// client restricts it.
const DefaultMode fs.FileMode = 0o666

// MaxPath is the longest socket path Linux takes (sun_path is 108 bytes,
// with the terminating NUL).
const MaxPath = 107

// staleProbe bounds the dial that tells a stale socket file (its server
// gone) from one a running server listens on.
const staleProbe = time.Second

// IsUnix reports whether addr names a Unix socket ("unix:...").
func IsUnix(addr string) bool { return strings.HasPrefix(addr, "unix:") }

// UnixPath returns the socket path of a "unix:" address as gRPC clients
// read it: "unix:///run/x.sock" and "unix:/run/x.sock" are /run/x.sock,
// "unix:x.sock" is relative to the working directory. It refuses what a
// gRPC client would dial differently, or not at all: a host
// ("unix://host/x"), '?', '#' or '%' in the path, and abstract sockets
// ("unix:@name"); and a path longer than a socket address holds.
func UnixPath(addr string) (string, error) {
	rest, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return "", fmt.Errorf("%q is no unix: address", addr)
	}
	if p, ok := strings.CutPrefix(rest, "//"); ok {
		if !strings.HasPrefix(p, "/") {
			return "", fmt.Errorf("%q names a host; write unix:///absolute/path or unix:relative/path", addr)
		}
		rest = p
	}
	switch {
	case rest == "":
		return "", errors.New("empty Unix socket path")
	case strings.HasPrefix(rest, "@"):
		return "", fmt.Errorf("%q: abstract sockets are not supported; give a path", addr)
	case strings.ContainsAny(rest, "?#%"):
		return "", fmt.Errorf("%q: a socket path with '?', '#' or '%%' reads differently as a gRPC target; choose another", addr)
	case len(rest) > MaxPath:
		return "", fmt.Errorf("socket path %s is %d bytes, longer than a Unix socket address holds (%d)", rest, len(rest), MaxPath)
	case len(stagingPath(filepath.Dir(rest), "00000000")) > MaxPath:
		dir := filepath.Dir(rest)
		return "", fmt.Errorf("socket path %s: its directory's path is %d bytes, and the socket is made first in a private folder there, %d bytes more, over the %d a socket address holds",
			rest, len(dir), len(stagingPath(dir, "00000000"))-len(dir), MaxPath)
	}
	return rest, nil
}

// stagingPath is where Listen makes a socket before moving it to a path in
// dir: s in a private folder .rls-<8 hexadecimal digits> (a fixed length,
// so that whether it fits a socket address does not depend on the draw).
func stagingPath(dir, id string) string { return filepath.Join(dir, ".rls-"+id, "s") }

// Target returns a listener's address as gRPC clients dial it: host:port,
// or unix:/path for a Unix socket.
func Target(a net.Addr) string {
	if a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return a.String()
}

// Listen listens on addr: a Unix socket for a "unix:" address (UnixPath),
// otherwise TCP.
//
// The socket is made with permission mode (which must let its owner read
// and write) in a private directory and then renamed into place, so that it
// is never reachable with another mode. A socket file left by a server that
// is gone (nothing accepts on it) is replaced; a socket a running server
// accepts on, or a file that is no socket, is refused. Closing the listener
// removes the socket, if it is still this listener's. Two processes started
// at once on one stale path may both replace it, and only the last one is
// reachable: give each process a path of its own.
func Listen(ctx context.Context, addr string, mode fs.FileMode) (net.Listener, error) {
	if !IsUnix(addr) {
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", addr)
	}
	path, err := UnixPath(addr)
	if err != nil {
		return nil, err
	}
	if !ownerReadWrite(mode) {
		return nil, fmt.Errorf("socket mode %#o: want permission bits that let the owner read and write (0600 to 0777)", uint32(mode))
	}
	if err := refuseInUse(ctx, path); err != nil {
		return nil, err
	}
	// A directory only this user may enter: nobody else can reach the
	// socket there, or swap it for a link before the chmod.
	tmp, err := makeStaging(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer os.RemoveAll(filepath.Dir(tmp))
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", tmp)
	if err != nil {
		return nil, err
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // it moves; Close removes it by its new name
	if err := os.Chmod(tmp, mode); err != nil {
		ul.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ul.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		ul.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &unixListener{UnixListener: ul, path: path, file: fi}, nil
}

// makeStaging makes a private folder in dir (mode 0700) and returns the
// socket path in it (stagingPath).
func makeStaging(dir string) (string, error) {
	var id [4]byte
	for range 100 {
		if _, err := rand.Read(id[:]); err != nil {
			return "", err
		}
		tmp := stagingPath(dir, hex.EncodeToString(id[:]))
		err := os.Mkdir(filepath.Dir(tmp), 0o700)
		if err == nil {
			return tmp, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("no free private folder name in %s after 100 tries", dir)
}

// refuseInUse returns an error if path exists and is not a stale socket.
func refuseInUse(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	d := net.Dialer{Timeout: staleProbe}
	c, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: another process is listening on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s is in use: %w", path, err)
	}
	return nil // stale: the rename replaces it
}

// unixListener removes its socket file when closed, unless another file
// has taken its path since.
type unixListener struct {
	*net.UnixListener
	path string
	file fs.FileInfo
	once sync.Once
}

// Addr is the socket's final path (the listener was bound elsewhere).
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close closes the listener and removes its socket file.
func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(fi, l.file) {
			os.Remove(l.path)
		}
	})
	return err
}

// ownerReadWrite reports whether m is permission bits only, and lets the
// socket's owner read and write (connect).
func ownerReadWrite(m fs.FileMode) bool { return m&^fs.ModePerm == 0 && m&0o600 == 0o600 }

// Mode is a socket permission as a flag.Value, written in octal ("0660").
type Mode fs.FileMode

// FileMode returns m as a permission.
func (m Mode) FileMode() fs.FileMode { return fs.FileMode(m) }

// String implements flag.Value.
func (m *Mode) String() string { return fmt.Sprintf("%#o", uint32(*m)) }

// Set implements flag.Value: an octal permission from 0600 to 0777 (the
// owner must be able to connect).
func (m *Mode) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || !ownerReadWrite(fs.FileMode(v)) {
		return fmt.Errorf("%q is not an octal permission from 0600 to 0777 (the owner must read and write)", s)
	}
	*m = Mode(v)
	return nil
}
