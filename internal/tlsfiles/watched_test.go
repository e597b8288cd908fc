package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// race is a watched over two files whose "configuration" is their content:
// it builds when the certificate and the key hold the same text (a pair),
// and fails otherwise (a renewal read between its two files). A read of the
// key can be held, or answered with stale content, once.
type race struct {
	t         *testing.T
	cert, key string
	w         *watched
	mu        sync.Mutex
	loads     []Loaded

	// hold, when armed, stops the next read of the key after it read the
	// file, until release is closed; reached is closed when it stops.
	hold    atomic.Bool
	reached chan struct{}
	release chan struct{}
	// stale, when set, is the key's content at its next read, once.
	stale atomic.Pointer[string]
}

func newRace(t *testing.T, content string) *race {
	t.Helper()
	dir := t.TempDir()
	r := &race{t: t, cert: filepath.Join(dir, "cert"), key: filepath.Join(dir, "key")}
	r.write(content, content)
	w, err := newWatched(fileSet{cert: r.cert, key: r.key}, buildPair, func(l Loaded) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.loads = append(r.loads, l)
	})
	if err != nil {
		t.Fatal(err)
	}
	w.readFile = r.read
	r.w = w
	return r
}

func buildPair(c contents) (*tls.Config, *x509.Certificate, error) {
	if string(c.cert) != string(c.key) {
		return nil, nil, errors.New("the key does not match the certificate")
	}
	return &tls.Config{ServerName: string(c.cert)}, nil, nil
}

func (r *race) write(cert, key string) {
	r.t.Helper()
	for name, content := range map[string]string{r.cert: cert, r.key: key} {
		if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *race) read(name string) ([]byte, error) {
	data, err := readRegular(name)
	if name != r.key {
		return data, err
	}
	if s := r.stale.Swap(nil); s != nil {
		return []byte(*s), nil
	}
	if r.hold.CompareAndSwap(true, false) {
		close(r.reached)
		<-r.release
	}
	return data, err
}

// heldCurrent starts current() in a goroutine whose read stops once it has
// read the files as they are now; it returns when the read is held, and
// the function that releases it and returns current()'s result.
func (r *race) heldCurrent() (finish func() *tls.Config) {
	r.reached, r.release = make(chan struct{}), make(chan struct{})
	r.hold.Store(true)
	done := make(chan *tls.Config, 1)
	go func() { done <- r.w.current() }()
	<-r.reached
	return func() *tls.Config {
		close(r.release)
		return <-done
	}
}

// kinds names the loads reported after the initial one.
func (r *race) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.loads[1:] {
		switch {
		case l.Restored:
			out = append(out, "restored")
		case l.Err != nil:
			out = append(out, "failed")
		default:
			out = append(out, "loaded")
		}
	}
	return out
}

// TestStaleReadIsNotApplied: a read that began before a later one was
// applied does not replace the later set when it finishes.
func TestStaleReadIsNotApplied(t *testing.T) {
	r := newRace(t, "v1")
	r.write("v2", "v2")
	finish := r.heldCurrent() // holds v2
	r.write("v3", "v3")
	if got := r.w.current().ServerName; got != "v3" {
		t.Fatalf("current() = %s, want v3", got)
	}
	if got := finish().ServerName; got != "v3" {
		t.Errorf("the stale read's current() = %s, want v3, the set applied", got)
	}
	if got := r.w.current().ServerName; got != "v3" {
		t.Errorf("after the stale read, current() = %s, want v3", got)
	}
	if got := r.kinds(); !slices.Equal(got, []string{"loaded"}) {
		t.Errorf("loads %v, want one (v3): the stale v2 is neither applied nor reported", got)
	}
}

// TestHalfWrittenRenewalIsReadAgain: a set read between its certificate and
// its key is read once more before it counts as a failure.
func TestHalfWrittenRenewalIsReadAgain(t *testing.T) {
	r := newRace(t, "v1")
	r.write("v2", "v2")
	stale := "v1"
	r.stale.Store(&stale) // the first read sees the new certificate with the old key
	if got := r.w.current().ServerName; got != "v2" {
		t.Fatalf("current() = %s, want v2", got)
	}
	if got := r.kinds(); !slices.Equal(got, []string{"loaded"}) {
		t.Errorf("loads %v, want one success and no failure", got)
	}
}

// TestStaleReadDoesNotEndAFailure: a read of the set in use that began
// before a failed set was applied does not report the failure over; the
// files put back do.
func TestStaleReadDoesNotEndAFailure(t *testing.T) {
	r := newRace(t, "v1")
	finish := r.heldCurrent() // holds v1, the set in use
	r.write("v2", "broken")
	if got := r.w.current().ServerName; got != "v1" {
		t.Fatalf("current() = %s, want v1 kept", got)
	}
	finish()
	if got := r.kinds(); !slices.Equal(got, []string{"failed"}) {
		t.Fatalf("loads %v, want the failure only: the stale read of v1 must not end it", got)
	}
	r.write("v1", "v1")
	r.w.current()
	if got := r.kinds(); !slices.Equal(got, []string{"failed", "restored"}) {
		t.Errorf("loads %v, want the failure, then restored when the files hold v1 again", got)
	}
}
