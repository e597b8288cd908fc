package failsoft

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

type selfKinded struct{}

func (selfKinded) Error() string          { return "self" }
func (selfKinded) StoreErrorKind() string { return "mine" }

// TestErrorKind: every kind of envoy_rls_store_errors_total, from errors as
// the store wraps them.
func TestErrorKind(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("%w: redis check script: %w", limiter.ErrUnavailable, err) }
	for _, c := range []struct {
		err  error
		want string
	}{
		{wrap(selfKinded{}), "mine"},
		{wrap(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), "tls"},
		{wrap(&net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}), "tls"},
		{wrap(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), "tls"},
		{wrap(errors.New("tls: server selected unsupported protocol version 300")), "tls"},
		{wrap(context.DeadlineExceeded), "timeout"},
		{wrap(&net.OpError{Op: "read", Err: syscall.ECONNRESET}), "connection"},
		{wrap(io.EOF), "connection"},
		{wrap(&net.OpError{Op: "dial", Err: errors.New("no route to host")}), "connection"},
		{wrap(errors.New("CLUSTERDOWN The cluster is down")), "cluster"},
		{wrap(errors.New("ERR something else")), "other"},
	} {
		if got := errorKind(c.err); got != c.want {
			t.Errorf("errorKind(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestErrorKindTLS: the errors of real TLS handshakes that either end
// refuses are of kind "tls": envoy-rls refusing Redis's certificate, and,
// on TLS 1.2, Redis refusing envoy-rls's. (On TLS 1.3 the client learns of
// Redis's refusal at its first read, and a write that comes first may meet
// the closed connection instead: "tls" or "connection", as TestErrorKind's
// alert and reset show.)
func TestErrorKindTLS(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithTLS(true))
	other := testenv.NewTLSFiles(t)
	for _, c := range []struct {
		name                 string
		ca, cert, key, sname string
		tls12                bool
	}{
		{"server of another authority", other.CA, r.TLS.ClientCert, r.TLS.ClientKey, "", false},
		{"another server name", r.TLS.CA, r.TLS.ClientCert, r.TLS.ClientKey, "redis.example", false},
		{"no client certificate, TLS 1.2", r.TLS.CA, "", "", "", true},
		{"client of another authority, TLS 1.2", r.TLS.CA, other.ClientCert, other.ClientKey, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: c.ca, Cert: c.cert, Key: c.key, ServerName: c.sname})
			if err != nil {
				t.Fatal(err)
			}
			if c.tls12 {
				cfg.MaxVersion = tls.VersionTLS12
			}
			b, err := redisbackend.New(redisbackend.Options{URL: "rediss://" + r.TLSAddr, TLS: func() *tls.Config { return cfg }, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			err = b.Check(context.Background(), []limiter.Request{{Key: "k", Limit: limiter.Limit{Requests: 1, Window: time.Second}, Hits: 1}}, make([]limiter.Result, 1))
			if err == nil || errorKind(err) != "tls" {
				t.Errorf("Check = %v, of kind %q; want a failure of kind tls", err, errorKind(err))
			}
		})
	}
}
