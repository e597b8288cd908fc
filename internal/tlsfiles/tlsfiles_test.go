package tlsfiles_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

// outcome is one handshake seen from both ends.
type outcome struct {
	client, server error
	// served is the certificate the client received; presented, the one
	// the server received (nil without one).
	served, presented *x509.Certificate
}

// handshake runs one TLS handshake on loopback between a client with cfg
// and a server with srv's configuration.
func handshake(t *testing.T, srv *tlsfiles.Server, cfg *tls.Config) outcome {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serverSide := make(chan outcome, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			serverSide <- outcome{server: err}
			return
		}
		defer conn.Close()
		sc := tls.Server(conn, srv.Config())
		o := outcome{server: sc.Handshake()}
		if peer := sc.ConnectionState().PeerCertificates; len(peer) > 0 {
			o.presented = peer[0]
		}
		serverSide <- o
	}()
	var o outcome
	conn, err := tls.Dial("tcp", ln.Addr().String(), cfg)
	if err == nil {
		o.served = conn.ConnectionState().PeerCertificates[0]
		// TLS 1.3 verifies the client's certificate after the client's
		// handshake returns: the refusal arrives as the first read's error.
		if _, err = conn.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			err = nil
		}
		conn.Close()
	}
	o.client = err
	s := <-serverSide
	o.server, o.presented = s.server, s.presented
	return o
}

// clientConfig trusts ca and presents the certificate certFile/keyFile
// (none when empty).
func clientConfig(t *testing.T, ca, certFile, keyFile string) *tls.Config {
	t.Helper()
	cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: ca, Cert: certFile, Key: keyFile, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// loads records the loads a Server reports.
type loads []tlsfiles.Loaded

func (l *loads) record(ev tlsfiles.Loaded) { *l = append(*l, ev) }

func TestServerServesItsCertificate(t *testing.T) {
	a := testenv.NewTLSFiles(t)
	var got loads
	srv, err := tlsfiles.NewServer(tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key}, got.record)
	if err != nil {
		t.Fatal(err)
	}
	want := testenv.Certificate(t, a.Cert)
	if len(got) != 1 || !got[0].Initial || got[0].Err != nil || !got[0].NotAfter.Equal(want.NotAfter) || got[0].Subject != want.Subject.String() {
		t.Fatalf("loads at start = %+v, want one initial load of %s until %v", got, want.Subject, want.NotAfter)
	}
	// Without client authorities, a client without a certificate is served.
	o := handshake(t, srv, clientConfig(t, a.CA, "", ""))
	if o.client != nil || o.server != nil {
		t.Fatalf("handshake: client %v, server %v", o.client, o.server)
	}
	if !bytes.Equal(o.served.Raw, want.Raw) {
		t.Errorf("served %s, want %s", o.served.Subject, want.Subject)
	}
	// Another authority's client does not trust it.
	if o := handshake(t, srv, clientConfig(t, testenv.NewTLSFiles(t).CA, "", "")); o.client == nil {
		t.Error("a client trusting another authority accepted the certificate")
	}
	if len(got) != 1 {
		t.Errorf("unchanged files reported %d loads after the first: %+v", len(got)-1, got[1:])
	}
}

// TestServerReloadsChangedFiles: a renewal written in place is served at
// the next handshake; a set that does not load keeps the previous
// certificate, is reported once, and is tried again once the files change.
func TestServerReloadsChangedFiles(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	c := a.Copy(t)
	cert, key := c.Cert, c.Key
	var got loads
	srv, err := tlsfiles.NewServer(tlsfiles.ServerFiles{Cert: cert, Key: key}, got.record)
	if err != nil {
		t.Fatal(err)
	}
	trustA, trustB := clientConfig(t, a.CA, "", ""), clientConfig(t, b.CA, "", "")
	serves := func(step string, cfg *tls.Config, want string) {
		t.Helper()
		o := handshake(t, srv, cfg)
		if o.client != nil || o.server != nil {
			t.Fatalf("%s: handshake: client %v, server %v", step, o.client, o.server)
		}
		if !bytes.Equal(o.served.Raw, testenv.Certificate(t, want).Raw) {
			t.Fatalf("%s: served %s (issuer %s), want %s", step, o.served.Subject, o.served.Issuer, want)
		}
	}
	serves("start", trustA, a.Cert)

	// Renewed: B's certificate and key, written in place.
	testenv.CopyFile(t, b.Cert, cert)
	testenv.CopyFile(t, b.Key, key)
	serves("renewed", trustB, b.Cert)
	if o := handshake(t, srv, trustA); o.client == nil {
		t.Error("renewed: a client trusting only the old authority accepted the new certificate")
	}
	if n := len(got); n != 2 || got[1].Initial || got[1].Err != nil || !got[1].NotAfter.Equal(testenv.Certificate(t, b.Cert).NotAfter) {
		t.Fatalf("loads after the renewal = %+v, want a second, successful one", got)
	}

	// Half-written: A's certificate with B's key does not load.
	testenv.CopyFile(t, a.Cert, cert)
	serves("half-written", trustB, b.Cert)
	serves("half-written, again", trustB, b.Cert)
	if n := len(got); n != 3 || got[2].Err == nil || !strings.Contains(got[2].Err.Error(), cert) {
		t.Fatalf("loads after a mismatched pair = %+v, want one failure naming %s", got, cert)
	}
	if !got[2].NotAfter.Equal(testenv.Certificate(t, b.Cert).NotAfter) {
		t.Errorf("the failure reports expiry %v, want the still-served certificate's %v", got[2].NotAfter, testenv.Certificate(t, b.Cert).NotAfter)
	}

	// Reverted: the files hold the served set again; the failure is over,
	// and nothing was loaded.
	testenv.CopyFile(t, b.Cert, cert)
	serves("reverted", trustB, b.Cert)
	if n := len(got); n != 4 || !got[3].Restored || got[3].Err != nil {
		t.Fatalf("loads after the revert = %+v, want a fourth, restoring the served set", got)
	}
	serves("reverted, again", trustB, b.Cert)
	if len(got) != 4 {
		t.Fatalf("the unchanged, served set was reported again: %+v", got[4:])
	}
	// Completed: A's certificate, then its key; no handshake in between.
	testenv.CopyFile(t, a.Cert, cert)
	testenv.CopyFile(t, a.Key, key)
	serves("completed", trustA, a.Cert)
	if n := len(got); n != 5 || got[4].Err != nil || got[4].Restored {
		t.Fatalf("loads after the key followed = %+v, want a fifth, successful one", got)
	}

	// Removed: the certificate file is gone; the loaded one is still served.
	if err := os.Remove(cert); err != nil {
		t.Fatal(err)
	}
	serves("removed", trustA, a.Cert)
	if n := len(got); n != 6 || got[5].Err == nil || !strings.Contains(got[5].Err.Error(), cert) {
		t.Fatalf("loads after the file was removed = %+v, want a failure naming %s", got, cert)
	}

	// A named pipe in its place: refused without blocking the handshake.
	if err := syscall.Mkfifo(cert, 0o600); err != nil {
		t.Fatal(err)
	}
	serves("a named pipe", trustA, a.Cert)
	if n := len(got); n != 7 || got[6].Err == nil || !strings.Contains(got[6].Err.Error(), cert+" is not a regular file") {
		t.Fatalf("loads after a named pipe took the file's place = %+v, want a failure saying it is not a regular file", got)
	}
}

// TestServerMutualTLS: with client authorities, every client must present
// a certificate they signed, and the authorities are read again when they
// change; with client names, the certificate must carry one.
func TestServerMutualTLS(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	dir := t.TempDir()
	clientCA := filepath.Join(dir, "client-ca.pem")
	testenv.CopyFile(t, a.CA, clientCA)
	srv, err := tlsfiles.NewServer(tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: clientCA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	accepts := func(step string, certFile, keyFile string, want bool) {
		t.Helper()
		o := handshake(t, srv, clientConfig(t, a.CA, certFile, keyFile))
		switch {
		case want && (o.client != nil || o.server != nil):
			t.Errorf("%s: refused: client %v, server %v", step, o.client, o.server)
		case !want && (o.server == nil || o.client == nil):
			t.Errorf("%s: accepted (client %v, server %v)", step, o.client, o.server)
		}
	}
	accepts("A's client", a.ClientCert, a.ClientKey, true)
	accepts("no certificate", "", "", false)
	accepts("B's client", b.ClientCert, b.ClientKey, false)
	// TLS 1.2 refuses during the handshake, TLS 1.3 after the client's.
	for _, c := range []struct{ cert, key string }{{"", ""}, {b.ClientCert, b.ClientKey}} {
		cfg := clientConfig(t, a.CA, c.cert, c.key)
		cfg.MaxVersion = tls.VersionTLS12
		if o := handshake(t, srv, cfg); o.client == nil || o.server == nil {
			t.Errorf("TLS 1.2 with client certificate %q: accepted (client %v, server %v)", c.cert, o.client, o.server)
		}
	}

	testenv.CopyFile(t, b.CA, clientCA)
	accepts("B's client once B is the client authority", b.ClientCert, b.ClientKey, true)
	accepts("A's client once B is the client authority", a.ClientCert, a.ClientKey, false)

	named := func(sans ...string) *tlsfiles.Server {
		srv, err := tlsfiles.NewServer(tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: a.CA, ClientSANs: sans}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	// a.ClientCert names DNS:client; a.Cert, presented as a client
	// certificate, DNS:localhost and IP 127.0.0.1.
	for _, tc := range []struct {
		sans           []string
		certFile, key  string
		want           bool
		refusalMention string
	}{
		{[]string{"client"}, a.ClientCert, a.ClientKey, true, ""},
		{[]string{"other", "client"}, a.ClientCert, a.ClientKey, true, ""},
		{[]string{"client"}, a.Cert, a.Key, false, "names none of client (it names localhost, 127.0.0.1)"},
		{[]string{"127.0.0.1"}, a.Cert, a.Key, true, ""},
		{[]string{"spiffe://cluster.local/ns/edge/sa/envoy"}, a.ClientCert, a.ClientKey, false, "names none of spiffe://"},
	} {
		o := handshake(t, named(tc.sans...), clientConfig(t, a.CA, tc.certFile, tc.key))
		switch {
		case tc.want && (o.client != nil || o.server != nil):
			t.Errorf("names %v, %s: refused: client %v, server %v", tc.sans, tc.certFile, o.client, o.server)
		case !tc.want && (o.server == nil || !strings.Contains(o.server.Error(), tc.refusalMention)):
			t.Errorf("names %v, %s: server error %v, want one saying %q", tc.sans, tc.certFile, o.server, tc.refusalMention)
		}
	}
}

// TestClientSourceReadsRenewedFiles: a client source presents a renewed
// client certificate, and trusts new authorities, from the next connection
// on; a set that does not load leaves the last good one in use and is
// reported once, and the files put back end the failure.
func TestClientSourceReadsRenewedFiles(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	renewedCert, renewedKey := a.RenewClient(t)
	c := a.Copy(t)
	ca, cert, key := c.CA, c.ClientCert, c.ClientKey
	var got loads
	src, err := tlsfiles.NewClientSource(tlsfiles.ClientFiles{CA: ca, Cert: cert, Key: key, ServerName: "localhost"}, got.record)
	if err != nil {
		t.Fatal(err)
	}
	first := testenv.Certificate(t, a.ClientCert)
	if len(got) != 1 || !got[0].Initial || got[0].Subject != first.Subject.String() || !got[0].NotAfter.Equal(first.NotAfter) {
		t.Fatalf("loads at start = %+v, want one initial load of %s until %v", got, first.Subject, first.NotAfter)
	}
	server := func(f tlsfiles.ServerFiles) *tlsfiles.Server {
		t.Helper()
		srv, err := tlsfiles.NewServer(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	// A's server asks for a client certificate A signed: the first and
	// the renewal alike.
	serverA := server(tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: a.CA})
	presents := func(step, want string) {
		t.Helper()
		o := handshake(t, serverA, src.Config())
		if o.client != nil || o.server != nil {
			t.Fatalf("%s: handshake: client %v, server %v", step, o.client, o.server)
		}
		if w := testenv.Certificate(t, want); o.presented == nil || !bytes.Equal(o.presented.Raw, w.Raw) {
			t.Fatalf("%s: the client presented %v, want %s's (serial %v)", step, o.presented, want, w.SerialNumber)
		}
	}
	presents("start", a.ClientCert)

	testenv.CopyFile(t, renewedCert, cert)
	testenv.CopyFile(t, renewedKey, key)
	presents("renewed", renewedCert)
	renewed := testenv.Certificate(t, renewedCert)
	if len(got) != 2 || got[1].Err != nil || got[1].Initial || !got[1].NotAfter.Equal(renewed.NotAfter) {
		t.Fatalf("loads after the renewal = %+v, want a second, successful one until %v", got, renewed.NotAfter)
	}

	// Half-written: the old certificate with the renewal's key.
	testenv.CopyFile(t, a.ClientCert, cert)
	presents("half-written", renewedCert)
	presents("half-written, again", renewedCert)
	if len(got) != 3 || got[2].Err == nil || !strings.Contains(got[2].Err.Error(), cert) {
		t.Fatalf("loads after a mismatched pair = %+v, want one failure naming %s", got, cert)
	}
	testenv.CopyFile(t, renewedCert, cert)
	presents("put back", renewedCert)
	if len(got) != 4 || !got[3].Restored {
		t.Fatalf("loads after the files were put back = %+v, want a fourth, restoring the set in use", got)
	}

	// New authorities: B's server is trusted from the next connection on,
	// A's no longer.
	testenv.CopyFile(t, b.CA, ca)
	if o := handshake(t, serverA, src.Config()); o.client == nil {
		t.Error("after the authorities changed to B, the client trusted A's server")
	}
	if o := handshake(t, server(tlsfiles.ServerFiles{Cert: b.Cert, Key: b.Key}), src.Config()); o.client != nil || o.server != nil {
		t.Errorf("after the authorities changed to B, B's server: client %v, server %v", o.client, o.server)
	}
	if len(got) != 5 || got[4].Err != nil {
		t.Fatalf("loads after the authorities changed = %+v, want a fifth, successful one", got)
	}

	// A source without a client certificate reports none.
	var bare loads
	if _, err := tlsfiles.NewClientSource(tlsfiles.ClientFiles{CA: a.CA}, bare.record); err != nil {
		t.Fatal(err)
	}
	if len(bare) != 1 || bare[0].Subject != "" || !bare[0].NotAfter.IsZero() {
		t.Errorf("loads of a source without a certificate = %+v, want one without a subject or expiry", bare)
	}
}

func TestNewServerRefusesBadFiles(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name  string
		files tlsfiles.ServerFiles
		want  string
	}{
		{"no key", tlsfiles.ServerFiles{Cert: a.Cert}, "both the certificate and the key"},
		{"names without authority", tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientSANs: []string{"client"}}, "no authority"},
		{"missing certificate", tlsfiles.ServerFiles{Cert: missing, Key: a.Key}, missing},
		{"missing authorities", tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: missing}, missing},
		{"key of another certificate", tlsfiles.ServerFiles{Cert: a.Cert, Key: b.Key}, a.Cert},
		{"junk certificate", tlsfiles.ServerFiles{Cert: junk, Key: a.Key}, junk},
		{"junk authorities", tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: junk}, "client authorities " + junk + ": no PEM certificate"},
	} {
		_, err := tlsfiles.NewServer(tc.files, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewServer error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}

// parseFlags parses args with the flags register registers.
func parseFlags(t *testing.T, register func(*flag.FlagSet), args []string) {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
}

// TestServerFlags: the server flags fill ServerFiles (client names
// comma-separated or repeated), and CheckFlags names a partial setting.
func TestServerFlags(t *testing.T) {
	parse := func(args ...string) tlsfiles.ServerFiles {
		t.Helper()
		var f tlsfiles.ServerFiles
		parseFlags(t, func(fs *flag.FlagSet) { f.Register(fs, "grpc.tls.") }, args)
		return f
	}
	f := parse("--grpc.tls.cert", "c", "--grpc.tls.key", "k", "--grpc.tls.client-ca", "ca",
		"--grpc.tls.client-san", "a, b", "--grpc.tls.client-san", "spiffe://td/c")
	if f.Cert != "c" || f.Key != "k" || f.ClientCA != "ca" || strings.Join(f.ClientSANs, " ") != "a b spiffe://td/c" {
		t.Errorf("parsed %+v", f)
	}
	if err := f.CheckFlags("grpc.tls."); err != nil {
		t.Errorf("a whole setting: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--grpc.tls.cert", "c"}, "--grpc.tls.cert and --grpc.tls.key go together"},
		{[]string{"--grpc.tls.client-ca", "ca"}, "--grpc.tls.client-ca is set, but TLS is off"},
		{[]string{"--grpc.tls.cert", "c", "--grpc.tls.key", "k", "--grpc.tls.client-san", "a"}, "--grpc.tls.client-san is set, but no --grpc.tls.client-ca"},
	} {
		if err := parse(tc.args...).CheckFlags("grpc.tls."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

func TestClientFlags(t *testing.T) {
	a := testenv.NewTLSFiles(t)
	parse := func(args ...string) (*tls.Config, error) {
		t.Helper()
		var f tlsfiles.ClientFlags
		parseFlags(t, func(fs *flag.FlagSet) { f.Register(fs, "server") }, args)
		return f.Config()
	}
	if cfg, err := parse(); cfg != nil || err != nil {
		t.Errorf("no flags: %v, %v; want plain text", cfg, err)
	}
	if cfg, err := parse("--tls"); err != nil || cfg == nil || cfg.RootCAs != nil {
		t.Errorf("--tls: %+v, %v; want TLS with the system's authorities", cfg, err)
	}
	cfg, err := parse("--tls.ca", a.CA, "--tls.cert", a.ClientCert, "--tls.key", a.ClientKey, "--tls.server-name", "rls.internal")
	if err != nil || cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "rls.internal" || cfg.InsecureSkipVerify {
		t.Errorf("every file flag: %+v, %v", cfg, err)
	}
	if cfg, err := parse("--tls.insecure-skip-verify"); err != nil || cfg == nil || !cfg.InsecureSkipVerify {
		t.Errorf("--tls.insecure-skip-verify alone: %+v, %v; want TLS without verification", cfg, err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls.cert", a.ClientCert}, "both the certificate and the key file"},
		{[]string{"--tls.ca", a.ClientKey}, "authorities " + a.ClientKey + ": no PEM certificate"},
		{[]string{"--tls.ca", missing}, "authorities: open " + missing},
		{[]string{"--tls.cert", missing, "--tls.key", a.ClientKey}, "certificate: open " + missing},
		{[]string{"--tls.cert", a.ClientCert, "--tls.key", a.Key}, "certificate " + a.ClientCert + " with key " + a.Key},
	} {
		if _, err := parse(tc.args...); err == nil || !strings.Contains(err.Error(), "--tls.*: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming --tls.* and saying %q", tc.args, err, tc.want)
		}
	}
}

// TestClientReadsAPipe: Client reads its files once, so they may be
// anything that reads, such as a shell's <(command); the sources that read
// them again take regular files only.
func TestClientReadsAPipe(t *testing.T) {
	a := testenv.NewTLSFiles(t)
	pipe := filepath.Join(t.TempDir(), "ca.pipe")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(a.CA)
	if err != nil {
		t.Fatal(err)
	}
	written := make(chan error, 1)
	go func() { written <- os.WriteFile(pipe, pem, 0o600) }()
	cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: pipe})
	if err != nil || cfg.RootCAs == nil {
		t.Fatalf("Client with the authorities in a named pipe: %v, %v", cfg, err)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if _, err := tlsfiles.NewClientSource(tlsfiles.ClientFiles{CA: pipe}, nil); err == nil || !strings.Contains(err.Error(), "authorities: "+pipe+" is not a regular file") {
		t.Errorf("NewClientSource with a named pipe: %v, want a refusal naming it", err)
	}
}
