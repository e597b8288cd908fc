package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/envoy-rls/envoy-rls/internal/logevery"
	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// tlsClient is a RateLimitService client over TLS with the files of f,
// closed when the test ends.
func tlsClient(t *testing.T, addr string, f tlsfiles.ClientFiles) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg, err := tlsfiles.Client(f)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// refusedHandshake opens one connection to addr, runs hello on it (a TLS
// handshake, or anything else) and reads until the server closes it; it
// returns the first error seen.
func refusedHandshake(t *testing.T, addr string, hello func(net.Conn) (net.Conn, error)) error {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	conn, err := hello(raw)
	if err != nil {
		return err
	}
	// TLS 1.3 refuses a client certificate after the client's handshake
	// returns: the alert, or the close, is what the first read sees.
	_, err = conn.Read(make([]byte, 1))
	return err
}

func tlsHello(cfg *tls.Config) func(net.Conn) (net.Conn, error) {
	return func(raw net.Conn) (net.Conn, error) {
		c := tls.Client(raw, cfg)
		return c, c.Handshake()
	}
}

// notAfter is the expiry of the certificate in certFile, in Unix seconds.
func notAfter(t *testing.T, certFile string) float64 {
	t.Helper()
	return float64(testenv.Certificate(t, certFile).NotAfter.Unix())
}

// serveTLS starts serve with its gRPC listener on TLS with files, domain g
// allowing 5 requests an hour per value of k, and its log in log. Its
// r.client speaks plain text: set a TLS one.
func serveTLS(t *testing.T, files tlsfiles.ServerFiles, log io.Writer) *running {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "g.yaml"), "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	return startServeLog(t, serveOptions{configDir: dir, grpcTLS: files}, log)
}

// TestServeGRPCTLS: with --grpc.tls.*, the gRPC listener serves mutual TLS
// to clients whose certificate names one of --grpc.tls.client-san, decides
// as over plain text, refuses every other client (counted, logged with the
// client's address and cause), and serves a renewed certificate from the
// next handshake on; a renewal that does not load keeps the previous one.
func TestServeGRPCTLS(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	c := a.Copy(t)
	cert, key := c.Cert, c.Key
	var log testenv.Buffer
	r := serveTLS(t, tlsfiles.ServerFiles{Cert: cert, Key: key, ClientCA: a.CA, ClientSANs: []string{"client"}}, &log)
	first := tlsClient(t, r.addrs.GRPC, tlsfiles.ClientFiles{CA: a.CA, Cert: a.ClientCert, Key: a.ClientKey})
	r.client = first
	if ok := r.admitted(t, 8, "g", "k", "v1"); ok != 5 {
		t.Errorf("over mutual TLS: admitted %d of 8 under a limit of 5", ok)
	}
	fams := scrape(t, r)
	for name, want := range map[string]float64{
		"envoy_rls_grpc_tls_certificate_expiry_timestamp_seconds": notAfter(t, a.Cert),
		"envoy_rls_grpc_tls_last_reload_successful":               1,
		"envoy_rls_grpc_tls_handshake_failures_total":             0,
	} {
		if v, ok := value(fams, name); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}

	// Refused: plain text, no client certificate, a certificate of another
	// name (a.Cert names localhost and 127.0.0.1). A connection closed
	// before any hello is a probe, not a failure.
	probe, err := net.Dial("tcp", r.addrs.GRPC)
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	trustA := func(certFile, keyFile string) *tls.Config {
		cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: a.CA, Cert: certFile, Key: keyFile, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		cfg.NextProtos = []string{"h2"}
		return cfg
	}
	refusals := map[string]func(net.Conn) (net.Conn, error){
		"plain text": func(c net.Conn) (net.Conn, error) {
			_, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
			return c, err
		},
		"no client certificate":   tlsHello(trustA("", "")),
		"a certificate of others": tlsHello(trustA(a.Cert, a.Key)),
	}
	for name, hello := range refusals {
		// The server closes a plain-text connection (EOF) and refuses a
		// TLS client with an alert.
		err := refusedHandshake(t, r.addrs.GRPC, hello)
		if err == nil || (name != "plain text" && errors.Is(err, io.EOF)) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	fams = scrapeUntil(t, r, "envoy_rls_grpc_tls_handshake_failures_total", float64(len(refusals)))
	logged := log.String()
	for _, want := range []string{
		"gRPC TLS: handshake failed",
		"first record does not look like a TLS handshake",
		"client didn't provide a certificate",
		"client certificate names none of client (it names localhost, 127.0.0.1)",
		"client=127.0.0.1:",
		`cause="not TLS"`,
		`cause="client certificate"`,
	} {
		if !strings.Contains(logged, want) {
			t.Errorf("log lacks %q:\n%s", want, logged)
		}
	}

	// Renewed in place by another authority's certificate: a new
	// connection trusting it is served; the open one goes on.
	testenv.CopyFile(t, b.Cert, cert)
	testenv.CopyFile(t, b.Key, key)
	renewed := tlsClient(t, r.addrs.GRPC, tlsfiles.ClientFiles{CA: b.CA, Cert: a.ClientCert, Key: a.ClientKey})
	r.client = renewed
	if ok := r.admitted(t, 6, "g", "k", "v2"); ok != 5 {
		t.Errorf("after the renewal: admitted %d of 6 under a limit of 5", ok)
	}
	r.client = first
	if ok := r.admitted(t, 1, "g", "k", "v1"); ok != 0 {
		t.Errorf("the first client, over its open connection: admitted %d, want 0 (5 of 5 used)", ok)
	}
	if err := refusedHandshake(t, r.addrs.GRPC, tlsHello(trustA(a.ClientCert, a.ClientKey))); err == nil {
		t.Error("after the renewal, a client trusting only the old authority completed a handshake")
	}
	fams = scrapeUntil(t, r, "envoy_rls_grpc_tls_reloads_total", 1, "result", "success")
	if v, _ := value(fams, "envoy_rls_grpc_tls_certificate_expiry_timestamp_seconds"); v != notAfter(t, b.Cert) {
		t.Errorf("expiry after the renewal %v, want the new certificate's %v", v, notAfter(t, b.Cert))
	}
	if !strings.Contains(log.String(), "gRPC TLS: files reloaded") {
		t.Errorf("log lacks the reload:\n%s", log.String())
	}

	// A renewal that does not load: the last good certificate is served.
	if err := os.WriteFile(cert, []byte("-----BEGIN CERTIFICATE-----\ntruncated"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.client = tlsClient(t, r.addrs.GRPC, tlsfiles.ClientFiles{CA: b.CA, Cert: a.ClientCert, Key: a.ClientKey})
	if ok := r.admitted(t, 1, "g", "k", "v3"); ok != 1 {
		t.Error("after a renewal that does not load, a client trusting the served certificate was not admitted")
	}
	fams = scrapeUntil(t, r, "envoy_rls_grpc_tls_reloads_total", 1, "result", "failure")
	if v, _ := value(fams, "envoy_rls_grpc_tls_last_reload_successful"); v != 0 {
		t.Errorf("envoy_rls_grpc_tls_last_reload_successful = %v after a failed load, want 0", v)
	}
	if !strings.Contains(log.String(), "gRPC TLS: the changed files did not load; the previous ones are still in use") {
		t.Errorf("log lacks the failed load:\n%s", log.String())
	}
}

// TestServeGRPCTLSFilesReadOnSIGHUP: a renewal of the --grpc.tls.* files is
// loaded, logged and its expiry exported at SIGHUP (and every
// --tls.check-interval), with no handshake to read them.
func TestServeGRPCTLSFilesReadOnSIGHUP(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	c := a.Copy(t)
	cert, key := c.Cert, c.Key
	var log testenv.Buffer
	r := serveTLS(t, tlsfiles.ServerFiles{Cert: cert, Key: key}, &log)
	testenv.CopyFile(t, b.Cert, cert)
	testenv.CopyFile(t, b.Key, key)
	r.hup <- os.Interrupt // any signal value
	fams := scrapeUntil(t, r, "envoy_rls_grpc_tls_reloads_total", 1, "result", "success")
	if v, _ := value(fams, "envoy_rls_grpc_tls_certificate_expiry_timestamp_seconds"); v != notAfter(t, b.Cert) {
		t.Errorf("expiry after the SIGHUP %v, want the renewal's %v", v, notAfter(t, b.Cert))
	}
	if !strings.Contains(log.String(), "gRPC TLS: files reloaded") {
		t.Errorf("log lacks the reload:\n%s", log.String())
	}
}

// TestQueryOverTLS: envoy-rls query speaks TLS with --tls.*, and a server
// it does not trust is an error naming the certificate.
func TestQueryOverTLS(t *testing.T) {
	a := testenv.NewTLSFiles(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "q.yaml"), "domain: q\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	r := startServe(t, serveOptions{configDir: dir, grpcTLS: tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key}})
	var out strings.Builder
	err := queryMain([]string{"--addr", r.addrs.GRPC, "--domain", "q", "--descriptor", "k=v", "--count", "3", "--tls.ca", a.CA}, &out, io.Discard)
	if err != nil {
		t.Fatalf("query over TLS: %v", err)
	}
	var codes []string
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "overall: "); ok {
			codes = append(codes, v)
		} else if _, v, ok := strings.Cut(sc.Text(), " overall: "); ok {
			codes = append(codes, v)
		}
	}
	if strings.Join(codes, " ") != "OK OK OVER_LIMIT" {
		t.Errorf("query over TLS answered %q, want OK OK OVER_LIMIT:\n%s", codes, out.String())
	}
	err = queryMain([]string{"--addr", r.addrs.GRPC, "--domain", "q", "--descriptor", "k=v", "--tls"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("query trusting the system's authorities: %v, want an error about the certificate", err)
	}
	var u usageError
	if err := queryMain([]string{"--descriptor", "k=v", "--tls.cert", a.ClientCert}, io.Discard, io.Discard); !errors.As(err, &u) || !strings.Contains(err.Error(), "--tls.*") {
		t.Errorf("--tls.cert without --tls.key: %v, want a usage error naming --tls.*", err)
	}
}

// TestServeRefusesMissingTLSFiles: a --grpc.tls.* file that does not load
// stops the start with its name, before anything listens.
func TestServeRefusesMissingTLSFiles(t *testing.T) {
	a, b := testenv.NewTLSFiles(t), testenv.NewTLSFiles(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ok.yaml"), "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name string
		tls  tlsfiles.ServerFiles
		want string
	}{
		{"missing certificate", tlsfiles.ServerFiles{Cert: missing, Key: a.Key}, missing},
		{"another key", tlsfiles.ServerFiles{Cert: a.Cert, Key: b.Key}, "certificate " + a.Cert + " with key " + b.Key},
		{"missing client CA", tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: missing}, missing},
	} {
		o := serveOptions{configDir: dir, headers: "ietf", grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", grpcTLS: tc.tls}
		err := serve(t.Context(), o, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "--grpc.tls.*: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a usage error naming --grpc.tls.* and %q", tc.name, err, tc.want)
		}
	}
}

// TestHandshakeObserver: a handshake that fails is logged with its cause
// and counted once; a connection closed without a word (a TCP probe) is
// neither counted nor logged above debug.
func TestHandshakeObserver(t *testing.T) {
	a := testenv.NewTLSFiles(t)
	srv, err := tlsfiles.NewServer(tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := m.ListenerTLS()
	if err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	h := handshakeObserver{TransportCredentials: credentials.NewTLS(srv.Config()), log: slog.New(slog.NewTextHandler(&log, nil)), tm: tm}
	failures := func() float64 {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		v, _ := value(byName, "envoy_rls_grpc_tls_handshake_failures_total")
		return v
	}
	// handshake runs the server's handshake on one end of a pipe while
	// client acts on the other, and returns the server's error. A
	// loopback TCP connection, not net.Pipe: a pipe has no buffer, and a
	// client that refuses the server's certificate writes its alert while
	// the server still writes its flight.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	handshake := func(client func(net.Conn)) error {
		t.Helper()
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := lis.Accept()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			client(c)
			io.Copy(io.Discard, c) //nolint:errcheck // until the server closes
			c.Close()
		}()
		_, _, err = h.ServerHandshake(s)
		s.Close()
		<-done
		return err
	}

	if err := handshake(func(c net.Conn) { c.Close() }); !errors.Is(err, io.EOF) {
		t.Fatalf("a probe: %v, want EOF", err)
	}
	if got := failures(); got != 0 {
		t.Errorf("a probe counted %v failures", got)
	}
	if log.String() != "" {
		t.Errorf("a probe was logged at info or above: %s", log.String())
	}

	err = handshake(func(c net.Conn) { io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") }) //nolint:errcheck // the server may stop reading
	if err == nil {
		t.Fatal("plain text: the handshake succeeded")
	}
	if got := failures(); got != 1 {
		t.Errorf("plain text counted %v failures, want 1", got)
	}
	if want := `msg="gRPC TLS: handshake failed" client=127.0.0.1:`; !strings.Contains(log.String(), want) || !strings.Contains(log.String(), err.Error()) {
		t.Errorf("log %q, want %q with the cause %q", log.String(), want, err)
	}

	// Through a limiter (--log.repeat-interval): every failure counted,
	// one line per interval for each class of cause, the next saying how
	// many were held, and Flush reporting a class that fell quiet.
	now := time.Unix(1e9, 0)
	lines := logevery.New(time.Minute, func() time.Time { return now })
	h.lines = lines
	plain := func(c net.Conn) { io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") }                //nolint:errcheck // the server may stop reading
	untrusting := func(c net.Conn) { tls.Client(c, &tls.Config{ServerName: "localhost"}).Handshake() } //nolint:errcheck,gosec // it refuses a certificate of an unknown authority
	for _, client := range []func(net.Conn){plain, plain, plain, plain, untrusting, untrusting} {
		if handshake(client) == nil {
			t.Fatal("the handshake succeeded")
		}
	}
	now = now.Add(time.Minute)
	if handshake(plain) == nil {
		t.Fatal("plain text: the handshake succeeded")
	}
	lines.Flush(context.Background())
	if got := failures(); got != 8 {
		t.Errorf("%v failures counted, want 8", got)
	}
	logged := strings.Split(strings.TrimSpace(log.String()), "\n")
	want := []string{
		`msg="gRPC TLS: handshake failed" client=127.0.0.1:`,
		`cause="not TLS"`,
		`cause="client alert"`,
		`cause="not TLS"`,
		`kind="TLS handshake: client alert" suppressed=1`,
	}
	if len(logged) != len(want) {
		t.Fatalf("log:\n%s\nwant %d lines: the first failure, then through the limiter a plain-text one, a client's alert, a plain-text one after the interval, and the alert's flush", log.String(), len(want))
	}
	for i, w := range want {
		if !strings.Contains(logged[i], w) {
			t.Errorf("line %d: %s\nwant %s", i, logged[i], w)
		}
	}
	if !strings.HasSuffix(logged[3], " suppressed=3") {
		t.Errorf("the plain-text line after the interval: %s\nwant suppressed=3", logged[3])
	}
}
