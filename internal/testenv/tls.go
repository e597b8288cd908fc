package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

// TLSFiles are the PEM files of a certificate authority made for one test,
// and of a server and a client certificate it signed, in a temporary
// directory.
type TLSFiles struct {
	// CA is the authority's certificate.
	CA string
	// Cert and Key are the server's certificate, for the IP 127.0.0.1 and
	// the name localhost, and its key. The certificate serves as a client
	// certificate too, as a Redis Cluster's nodes present theirs to one
	// another.
	Cert, Key string
	// ClientCert and ClientKey are a client certificate (for the name
	// client) and its key.
	ClientCert, ClientKey string

	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	issued int64 // serial numbers of the certificates signed so far
}

// NewTLSFiles makes a new authority and its server and client certificates
// (ECDSA P-256, valid from an hour ago until a day from now). Each call
// makes a different authority, with a name of its own, which trusts none of
// another's certificates.
func NewTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	f, err := newTLSFiles(t.TempDir())
	if err != nil {
		t.Fatalf("testenv: TLS certificates: %v", err)
	}
	return f
}

func newTLSFiles(dir string) (*TLSFiles, error) {
	f := &TLSFiles{
		dir:        dir,
		CA:         filepath.Join(dir, "ca.pem"),
		Cert:       filepath.Join(dir, "server.pem"),
		Key:        filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, fmt.Errorf("CA serial: %w", err)
	}
	ca := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("envoy-rls test CA %x", serial)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	f.caKey = caKey
	if f.ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if err := f.issue("localhost", both, []net.IP{net.IPv4(127, 0, 0, 1)}, now.Add(24*time.Hour), f.Cert, f.Key); err != nil {
		return nil, err
	}
	if err := f.issue("client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, now.Add(24*time.Hour), f.ClientCert, f.ClientKey); err != nil {
		return nil, err
	}
	return f, nil
}

// issue writes a certificate for name, signed by f's authority, valid from
// an hour ago until notAfter, to certFile, and its new key to keyFile.
func (f *TLSFiles) issue(name string, usage []x509.ExtKeyUsage, ips []net.IP, notAfter time.Time, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("key %s: %w", name, err)
	}
	f.issued++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(f.issued + 1),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.ca, &key.PublicKey, f.caKey)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", name, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("key %s: %w", name, err)
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", kder)
}

// Copy copies f's files to a new temporary directory, for a test that
// writes renewals over them: the copy's files have f's contents (the copy
// signs nothing: RenewClient on it fails the test).
func (f *TLSFiles) Copy(t testing.TB) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	c := &TLSFiles{dir: dir}
	for _, p := range []struct {
		dst *string
		src string
	}{
		{&c.CA, f.CA}, {&c.Cert, f.Cert}, {&c.Key, f.Key}, {&c.ClientCert, f.ClientCert}, {&c.ClientKey, f.ClientKey},
	} {
		*p.dst = filepath.Join(dir, filepath.Base(p.src))
		CopyFile(t, p.src, *p.dst)
	}
	return c
}

// RenewClient signs a renewal of the client certificate: for the name
// client again, with a new key and serial number, valid for a day longer
// than ClientCert. It returns the new certificate's and key's files (f's
// own are left as they are). It is not safe for concurrent use.
func (f *TLSFiles) RenewClient(t testing.TB) (cert, key string) {
	t.Helper()
	if f.caKey == nil {
		t.Fatal("testenv: RenewClient on a copy of TLS files, which signs nothing")
	}
	n := f.issued + 1
	cert, key = filepath.Join(f.dir, fmt.Sprintf("client-%d.pem", n)), filepath.Join(f.dir, fmt.Sprintf("client-%d-key.pem", n))
	if err := f.issue("client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, Certificate(t, f.ClientCert).NotAfter.Add(24*time.Hour), cert, key); err != nil {
		t.Fatalf("testenv: renewing the client certificate: %v", err)
	}
	return cert, key
}

// ClientConfig is a client's TLS configuration for f's servers: it trusts
// f.CA alone and presents f.ClientCert.
func (f *TLSFiles) ClientConfig() (*tls.Config, error) {
	return tlsfiles.Client(tlsfiles.ClientFiles{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey})
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// redisArgs are redis-server's arguments to serve TLS on port with f's
// certificates, asking clients for a certificate signed by f.CA when
// clientAuth is set (tls-auth-clients yes) and accepting them without one
// otherwise (optional: one that is presented is still verified).
func (f *TLSFiles) redisArgs(port int, clientAuth bool) []string {
	auth := "optional"
	if clientAuth {
		auth = "yes"
	}
	return []string{
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", f.Cert,
		"--tls-key-file", f.Key,
		"--tls-ca-cert-file", f.CA,
		"--tls-auth-clients", auth,
	}
}

// Certificate is the first certificate in the PEM file at path.
func Certificate(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// CopyFile writes src's content to dst in place (dst keeps its inode), as a
// certificate renewal written over the old file does.
func CopyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
