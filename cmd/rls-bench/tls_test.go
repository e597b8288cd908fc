package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/cmd/rls-bench/internal/bench"
	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

// startServeNoop runs `rls-bench serve-noop --addr 127.0.0.1:0 args...` in
// this process until the test ends, and returns the address and the mode
// ("plain text", "TLS", "mutual TLS") its log names. The test fails unless
// it then stops with exit code 0.
func startServeNoop(t *testing.T, args ...string) (addr, mode string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		c := run(ctx, append([]string{"serve-noop", "--addr", "127.0.0.1:0"}, args...), io.Discard, pw)
		pw.Close()
		code <- c
	}()
	listening := regexp.MustCompile(`listening on (\S+) \((.+)\)$`)
	sc := bufio.NewScanner(pr)
	var log strings.Builder
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			addr, mode = m[1], m[2]
			break
		}
	}
	if addr == "" {
		cancel()
		t.Fatalf("serve-noop %q stopped (exit code %d) before it listened:\n%s", args, <-code, log.String())
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		io.Copy(io.Discard, pr) //nolint:errcheck // ends when serve-noop returns
	}()
	t.Cleanup(func() {
		cancel()
		if c := <-code; c != 0 {
			t.Errorf("serve-noop %q: exit code %d", args, c)
		}
		<-drained
	})
	return addr, mode
}

// loadRun runs rls-bench (a load run) with args.
func loadRun(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// short are the arguments of a short run, whose requests cannot time out.
var short = []string{"--requests", "50", "--warmup", "0", "--connections", "2", "--concurrency", "4", "--timeout", "1m"}

// checkAllOK checks that the JSON results are want runs of 50 requests,
// all answered OK.
func checkAllOK(t *testing.T, stdout string, want int) []*bench.Result {
	t.Helper()
	rs, err := bench.ReadJSON(strings.NewReader(stdout))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != want {
		t.Fatalf("%d results, want %d:\n%s", len(rs), want, stdout)
	}
	for _, r := range rs {
		if r.Requests != 50 || r.OK != 50 || r.Errors != 0 {
			t.Errorf("%s: requests=%d ok=%d errors=%d (%v), want 50 OK", r.Label, r.Requests, r.OK, r.Errors, r.ErrorKinds)
		}
	}
	return rs
}

// TestTLSAgainstServeNoop: serve-noop --tls.cert/--tls.key serves TLS, and
// a run with --tls.ca of its authority gets every answer from it, as the
// target and as the --ceiling-addr ceiling (dialled with the same
// settings). It serves nothing in plain text, and a run trusting another
// authority stops, saying why the certificate was refused.
func TestTLSAgainstServeNoop(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	addr, mode := startServeNoop(t, "--tls.cert", files.Cert, "--tls.key", files.Key)
	if mode != "TLS" {
		t.Errorf("serve-noop says it serves %q, want TLS", mode)
	}

	code, stdout, stderr := loadRun(append([]string{"--addr", addr, "--ceiling-addr", addr, "--tls.ca", files.CA, "--json"}, short...)...)
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, stderr)
	}
	rs := checkAllOK(t, stdout, 2)
	if !rs[0].Ceiling || rs[1].Ceiling {
		t.Errorf("want the ceiling run, then the target's: %+v", rs)
	}
	for _, r := range rs {
		if r.TLS != "tls" {
			t.Errorf("%s: recorded TLS %q, want tls", r.Label, r.TLS)
		}
	}

	// --tls.server-name: the certificate's other name.
	code, stdout, stderr = loadRun(append([]string{"--addr", addr, "--tls.ca", files.CA, "--tls.server-name", "localhost", "--json"}, short...)...)
	if code != 0 {
		t.Fatalf("--tls.server-name localhost: exit code %d:\n%s", code, stderr)
	}
	checkAllOK(t, stdout, 1)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// The server's handshake fails on the client's HTTP/2 preface.
		{"plain text", nil, "not ready within 1s (last state TRANSIENT_FAILURE: "},
		{"another authority", []string{"--tls.ca", testenv.NewTLSFiles(t).CA}, "x509: certificate signed by unknown authority"},
		{"another name", []string{"--tls.ca", files.CA, "--tls.server-name", "elsewhere"}, "x509: certificate is valid for localhost, not elsewhere"},
		{"another authority, ceiling", []string{"--ceiling-addr", addr, "--tls.ca", testenv.NewTLSFiles(t).CA}, "ceiling: bench ceiling: connect to " + addr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--addr", addr, "--connect-timeout", "1s"}, tc.args...)
			code, _, stderr := loadRun(append(args, short...)...)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit code %d, want 1 and an error containing %q:\n%s", code, tc.want, stderr)
			}
		})
	}
}

// TestMutualTLSAgainstServeNoop: with --tls.client-ca serve-noop answers
// only a client that presents a certificate its authority signed.
func TestMutualTLSAgainstServeNoop(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	addr, mode := startServeNoop(t, "--tls.cert", files.Cert, "--tls.key", files.Key, "--tls.client-ca", files.CA)
	if mode != "mutual TLS" {
		t.Errorf("serve-noop says it serves %q, want mutual TLS", mode)
	}
	code, stdout, stderr := loadRun(append([]string{"--addr", addr, "--tls.ca", files.CA,
		"--tls.cert", files.ClientCert, "--tls.key", files.ClientKey, "--json"}, short...)...)
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, stderr)
	}
	if r := checkAllOK(t, stdout, 1)[0]; r.TLS != "mutual" {
		t.Errorf("recorded TLS %q, want mutual", r.TLS)
	}

	// The reason varies: in TLS 1.3 the client's handshake is over before
	// the server refuses it, so the client may first see the refusal
	// ("certificate required") or its write fail on the closed connection.
	code, _, stderr = loadRun(append([]string{"--addr", addr, "--tls.ca", files.CA, "--connect-timeout", "1s"}, short...)...)
	if want := "not ready within 1s (last state TRANSIENT_FAILURE: "; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("without a client certificate: exit code %d, want 1 and an error containing %q:\n%s", code, want, stderr)
	}
}

// TestTLSFlagRefusals: partial or impossible TLS settings are refused with
// exit code 2, naming the flags.
func TestTLSFlagRefusals(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	// A cancelled context: a serve-noop that does not refuse its flags
	// stops at once (with exit code 0).
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	noop := func(args ...string) []string {
		return append([]string{"serve-noop", "--addr", "127.0.0.1:0"}, args...)
	}
	// An unreadable file's error names the flags and the file (its
	// wording is internal/tlsfiles's).
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{noop("--tls.cert", files.Cert), []string{"--tls.cert and --tls.key go together"}},
		{noop("--tls.key", files.Key), []string{"--tls.cert and --tls.key go together"}},
		{noop("--tls.client-ca", files.CA), []string{"--tls.client-ca is set, but TLS is off"}},
		{noop("--tls.cert", missing, "--tls.key", files.Key), []string{"--tls.*: ", missing}},
		{noop("--tls.cert", files.Cert, "--tls.key", files.Key, "--tls.client-ca", missing), []string{"--tls.*: ", missing}},
		{[]string{"--self-test", "--tls.ca", files.CA}, []string{"start `rls-bench serve-noop --tls.cert F --tls.key F` and pass its address with --ceiling-addr"}},
		{[]string{"--self-test", "--addr", "127.0.0.1:1", "--tls"}, []string{"--self-test's do-nothing server runs in this process in plain text, but --tls/--tls.* ask for TLS"}},
		{[]string{"--addr", "127.0.0.1:1", "--tls.cert", files.ClientCert}, []string{"--tls.*: ", "key"}},
		{[]string{"--addr", "127.0.0.1:1", "--tls.ca", missing}, []string{"--tls.*: ", missing}},
	} {
		var out, errb bytes.Buffer
		code := run(cancelled, tc.args, &out, &errb)
		if code != 2 {
			t.Errorf("%q: exit code %d, want 2:\n%s", tc.args, code, errb.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%q: the error does not say %q:\n%s", tc.args, w, errb.String())
			}
		}
	}

	// The in-process ceiling is not used when --ceiling-addr is set.
	cfg, err := parseLoad([]string{"--addr", "127.0.0.1:1", "--self-test", "--ceiling-addr", "127.0.0.1:2", "--tls"}, &bytes.Buffer{})
	if err != nil || cfg.opts.TLS == nil {
		t.Errorf("--self-test --ceiling-addr with --tls: TLS %v, error %v; want TLS and no error", cfg.opts.TLS, err)
	}
}

// TestNoopTLSLine: each kind of load of serve-noop's TLS files has its line;
// files put back are not reported as a reload.
func TestNoopTLSLine(t *testing.T) {
	at := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		l    tlsfiles.Loaded
		want string
	}{
		{tlsfiles.Loaded{Initial: true, Subject: "CN=a"}, ""},
		{tlsfiles.Loaded{Subject: "CN=a", NotAfter: at}, "TLS files reloaded: CN=a, valid until 2027-01-02T03:04:05Z"},
		{tlsfiles.Loaded{Subject: "CN=a", Err: errors.New("bad key")}, "the changed TLS files did not load, CN=a is still served: bad key"},
		{tlsfiles.Loaded{Restored: true, Subject: "CN=a", NotAfter: at}, "the TLS files hold the ones in use again: CN=a"},
	} {
		if got := noopTLSLine(c.l); got != c.want {
			t.Errorf("%+v: %q, want %q", c.l, got, c.want)
		}
	}
}
