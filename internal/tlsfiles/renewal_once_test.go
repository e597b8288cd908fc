package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// TestOneRenewalReportedOnce: two handshakes that read the same renewed
// set, the earlier-numbered read finishing its build first, report it once,
// good or bad. Each applied and reported it (a review's finding): "files
// reloaded" logged twice and envoy_rls_grpc_tls_reloads_total counting 2
// for one renewal, and a bad set's error logged once per overlapping
// handshake where README says it is logged once.
func TestOneRenewalReportedOnce(t *testing.T) {
	for _, tc := range []struct {
		name, cert, key string
	}{
		{"good renewal", "v2", "v2"},
		{"bad renewal", "v2", "broken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cert, key := filepath.Join(dir, "cert"), filepath.Join(dir, "key")
			write := func(c, k string) {
				os.WriteFile(cert, []byte(c), 0o600)
				os.WriteFile(key, []byte(k), 0o600)
			}
			write("v1", "v1")

			var (
				mu      sync.Mutex
				reports []Loaded
				builds  atomic.Int32
				// holdBuild stops the first build after construction
				// until released.
				buildHeld, buildRelease = make(chan struct{}), make(chan struct{})
				// holdRead stops the next read of the key, armed below.
				holdRead              = atomic.Bool{}
				readHeld, readRelease = make(chan struct{}), make(chan struct{})
			)
			build := func(c contents) (*tls.Config, *x509.Certificate, error) {
				if builds.Add(1) == 2 { // 1 is newWatched's
					close(buildHeld)
					<-buildRelease
				}
				return buildPair(c)
			}
			w, err := newWatched(fileSet{cert: cert, key: key}, build, func(l Loaded) {
				mu.Lock()
				reports = append(reports, l)
				mu.Unlock()
			})
			if err != nil {
				t.Fatal(err)
			}
			w.readFile = func(name string) ([]byte, error) {
				data, err := readRegular(name)
				if name == key && holdRead.CompareAndSwap(true, false) {
					close(readHeld)
					<-readRelease
				}
				return data, err
			}
			write(tc.cert, tc.key)

			holdRead.Store(true)
			aDone := make(chan struct{})
			go func() { w.current(); close(aDone) }() // A: read n, held mid-read
			<-readHeld
			bDone := make(chan struct{})
			go func() { w.current(); close(bDone) }() // B: read n+1, build held
			<-buildHeld
			close(readRelease) // A finishes its read, builds and applies
			<-aDone
			close(buildRelease) // B applies the same set again
			<-bDone

			mu.Lock()
			defer mu.Unlock()
			if n := len(reports) - 1; n != 1 {
				t.Errorf("one %s reported %d times: %+v", tc.name, n, reports[1:])
			}
		})
	}
}
