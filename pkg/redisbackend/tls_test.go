package redisbackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestTLS: a Redis that serves TLS and asks for a client certificate
// (tls-auth-clients yes) is reached with the configuration --redis.tls.*
// builds (tlsfiles.ClientSource), on a rediss:// URL and on a redis:// one alike (the configuration turns TLS
// on): every connection the Backend opens came in on the TLS port, and four
// instances hammering one key over TLS admit exactly the model's count for
// every algorithm. A configuration Redis or the client must refuse is an
// error wrapping limiter.ErrUnavailable that names the cause, never a
// decision.
func TestTLS(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithTLS(true))
	f := r.TLS
	other := testenv.NewTLSFiles(t) // an authority that signed none of r's certificates
	ctx := context.Background()
	tlsConfig := func(t *testing.T, ca, cert, key, serverName string, insecure bool) Options {
		t.Helper()
		src, err := tlsfiles.NewClientSource(tlsfiles.ClientFiles{CA: ca, Cert: cert, Key: key, ServerName: serverName, Insecure: insecure}, nil)
		if err != nil {
			t.Fatalf("tlsfiles.NewClientSource: %v", err)
		}
		return Options{URL: "rediss://" + r.TLSAddr, TLS: src.Config, KeyPrefix: "tls:", Timeout: testTimeout}
	}
	check := func(t *testing.T, o Options) ([]limiter.Result, error) {
		t.Helper()
		b := openBackend(t, o) // its connections stay for CheckClientsOnTLS
		res := make([]limiter.Result, 1)
		req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}}
		return res, b.Check(ctx, req, res)
	}

	t.Run("accepted", func(t *testing.T) {
		for _, c := range []struct {
			name string
			o    Options
		}{
			{"mutual", tlsConfig(t, f.CA, f.ClientCert, f.ClientKey, "", false)},
			{"server name", tlsConfig(t, f.CA, f.ClientCert, f.ClientKey, "localhost", false)},
			{"redis:// with a configuration", func() Options {
				o := tlsConfig(t, f.CA, f.ClientCert, f.ClientKey, "", false)
				o.URL = "redis://" + r.TLSAddr
				return o
			}()},
			{"unverified", tlsConfig(t, other.CA, f.ClientCert, f.ClientKey, "", true)},
		} {
			t.Run(c.name, func(t *testing.T) {
				res, err := check(t, c.o)
				if err != nil || !res[0].Allowed {
					t.Fatalf("Check = %v, %+v; want allowed", err, res[0])
				}
				r.CheckClientsOnTLS(t)
			})
		}
	})

	t.Run("refused", func(t *testing.T) {
		// When Redis refuses envoy-rls's certificate, TLS 1.3 tells the
		// client at its first read: a write that comes first meets the
		// closed connection instead. TLS 1.2 ends the handshake with
		// Redis's alert.
		refusedByRedis := []string{"remote error: tls", "connection reset by peer", "broken pipe", "EOF"}
		tls12 := func(o Options) Options {
			config := o.TLS
			o.TLS = func() *tls.Config {
				cfg := config().Clone()
				cfg.MaxVersion = tls.VersionTLS12
				return cfg
			}
			return o
		}
		for _, c := range []struct {
			name string
			o    Options
			want []string // the error names one of them
		}{
			{"no client certificate", tlsConfig(t, f.CA, "", "", "", false), refusedByRedis},
			{"client certificate of another authority", tlsConfig(t, f.CA, other.ClientCert, other.ClientKey, "", false), refusedByRedis},
			{"no client certificate, TLS 1.2", tls12(tlsConfig(t, f.CA, "", "", "", false)), []string{"remote error: tls: "}},
			{"client certificate of another authority, TLS 1.2", tls12(tlsConfig(t, f.CA, other.ClientCert, other.ClientKey, "", false)), []string{"remote error: tls: "}},
			{"server of another authority", tlsConfig(t, other.CA, f.ClientCert, f.ClientKey, "", false), []string{"certificate signed by unknown authority"}},
			{"system authorities", Options{URL: "rediss://" + r.TLSAddr, KeyPrefix: "tls:", Timeout: testTimeout}, []string{"certificate signed by unknown authority"}},
			{"another server name", tlsConfig(t, f.CA, f.ClientCert, f.ClientKey, "redis.example", false), []string{"certificate is valid for localhost, not redis.example"}},
			{"plain TCP", Options{URL: "redis://" + r.TLSAddr, KeyPrefix: "tls:", Timeout: 5 * time.Second}, []string{"EOF", "connection reset by peer"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				_, err := check(t, c.o)
				named := err != nil && slices.ContainsFunc(c.want, func(w string) bool { return strings.Contains(err.Error(), w) })
				if !errors.Is(err, limiter.ErrUnavailable) || !named {
					t.Fatalf("Check = %v; want ErrUnavailable naming one of %q", err, c.want)
				}
			})
		}
	})

	t.Run("hammer", func(t *testing.T) {
		o := tlsConfig(t, f.CA, f.ClientCert, f.ClientKey, "", false)
		hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
			return openBackend(t, Options{URL: o.URL, TLS: o.TLS, KeyPrefix: DefaultKeyPrefix, Now: now, Timeout: testTimeout})
		})
	})
}

// TestTLSCluster: a Redis Cluster whose nodes serve TLS, ask for a client
// certificate and name their TLS ports to a client on TLS (tls-cluster yes)
// is reached from its masters' TLS addresses: the slots' calls of one Check
// go to every master over TLS, and four instances hammering one key admit
// exactly the model's count for every algorithm.
func TestTLSCluster(t *testing.T) {
	c := testenv.RedisCluster(t, testenv.WithClusterTLS(true))
	cfg, dials := mutualTLS(t, c.TLS)
	newTLS := func(t *testing.T, prefix string, now func() time.Time) *Backend {
		t.Helper()
		return openBackend(t, Options{ClusterAddrs: c.TLSAddrs, TLS: cfg, KeyPrefix: prefix, Now: now, Timeout: testTimeout})
	}

	t.Run("every master", func(t *testing.T) {
		before := dials.Load()
		b := newTLS(t, "tlsc:", nil)
		// One key per master: each slot's call reaches its master.
		l := limiter.Limit{Requests: 10, Window: time.Minute}
		var reqs []limiter.Request
		owners := map[*testenv.Redis]bool{}
		for i := 0; len(reqs) < len(c.Masters); i++ {
			req := limiter.Request{Key: key(t.Name(), fmt.Sprint(i)), Limit: l, Hits: 1}
			if m := c.MasterForKey(baseKey("tlsc:", req)); !owners[m] {
				owners[m] = true
				reqs = append(reqs, req)
			}
		}
		res := make([]limiter.Result, len(reqs))
		if err := b.Check(context.Background(), reqs, res); err != nil {
			t.Fatalf("Check: %v", err)
		}
		for i, r := range res {
			if !r.Allowed {
				t.Errorf("request %d: %+v, want allowed", i, r)
			}
		}
		for _, m := range c.Masters {
			m.CheckClientsOnTLS(t)
		}
		// Each connection, one to every master at least, asked for its
		// configuration as it was dialled.
		if n := dials.Load() - before; n < int64(len(c.Masters)) {
			t.Errorf("%d configurations asked for, want one per connection, %d at least", n, len(c.Masters))
		}
	})

	t.Run("hammer", func(t *testing.T) {
		hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
			return newTLS(t, DefaultKeyPrefix, now)
		})
	})
}

// TestTLSSentinel: with Sentinel, one TLS configuration reaches the
// sentinels and the master they name, all serving TLS and asking for a
// client certificate: every connection to the master came in on its TLS
// port, and four instances hammering one key admit exactly the model's
// count for every algorithm.
func TestTLSSentinel(t *testing.T) {
	s := testenv.RedisSentinel(t, testenv.WithSentinelTLS(true))
	cfg, dials := mutualTLS(t, s.TLS)
	newTLS := func(t *testing.T, prefix string, now func() time.Time) *Backend {
		t.Helper()
		return openBackend(t, Options{SentinelAddrs: s.SentinelTLSAddrs, SentinelMaster: s.MasterName, TLS: cfg,
			KeyPrefix: prefix, Now: now, Timeout: testTimeout})
	}

	t.Run("master", func(t *testing.T) {
		before := dials.Load()
		b := newTLS(t, "tlss:", nil)
		res := make([]limiter.Result, 1)
		req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 10, Window: time.Minute}, Hits: 1}}
		if err := b.Check(context.Background(), req, res); err != nil || !res[0].Allowed {
			t.Fatalf("Check = %v, %+v; want allowed", err, res[0])
		}
		// The replica and the sentinels are on its TLS port too
		// (tls-replication yes).
		s.Master.CheckClientsOnTLS(t)
		// A sentinel's connection and the master's each asked for their
		// configuration as they were dialled.
		if n := dials.Load() - before; n < 2 {
			t.Errorf("%d configurations asked for, want one per connection, 2 at least", n)
		}
	})

	t.Run("hammer", func(t *testing.T) {
		hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
			return newTLS(t, DefaultKeyPrefix, now)
		})
	})

	// The sentinels name the replica by its TLS address too (it announces
	// its TLS port with tls-replication), so the same Backend follows a
	// failover over TLS.
	t.Run("failover", func(t *testing.T) {
		b := newTLS(t, "tlsf:", nil)
		ctx := context.Background()
		req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 1 << 20, Window: time.Hour}, Hits: 1}}
		check := func() error { return b.Check(ctx, req, make([]limiter.Result, 1)) }
		if err := check(); err != nil {
			t.Fatalf("Check before failover: %v", err)
		}
		s.Master.Stop()
		fctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		addr, err := s.WaitFailover(fctx)
		if err != nil {
			t.Fatalf("failover: %v", err)
		}
		if addr != s.Replica.TLSAddr {
			t.Fatalf("the sentinels name the new master %s, want the replica's TLS address %s", addr, s.Replica.TLSAddr)
		}
		if err := waitFor(check); err != nil {
			t.Fatalf("no successful Check after the failover to %s: %v", addr, err)
		}
		s.Replica.CheckClientsOnTLS(t)
	})
}

// mutualTLS is the configuration --redis.tls.* builds for f's servers: it
// trusts f.CA and presents f's client certificate. dials counts the calls,
// one per connection dialled.
func mutualTLS(t *testing.T, f *testenv.TLSFiles) (config func() *tls.Config, dials *atomic.Int64) {
	t.Helper()
	src, err := tlsfiles.NewClientSource(tlsfiles.ClientFiles{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey}, nil)
	if err != nil {
		t.Fatalf("tlsfiles.NewClientSource: %v", err)
	}
	dials = new(atomic.Int64)
	return func() *tls.Config {
		dials.Add(1)
		return src.Config()
	}, dials
}

// TestTLSWithoutConfiguration: a TLS function that returns nil fails the
// dial instead of connecting in plain text.
func TestTLSWithoutConfiguration(t *testing.T) {
	r := testenv.RedisServer(t)
	b := openBackend(t, Options{URL: "redis://" + r.Addr, TLS: func() *tls.Config { return nil }, Timeout: testTimeout})
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 1, Window: time.Minute}, Hits: 1}}
	if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err == nil || !strings.Contains(err.Error(), "no TLS configuration") {
		t.Errorf("Check = %v, want a failed dial saying there is no TLS configuration", err)
	}
}

// TestTLSRenewedFiles: the --redis.tls.* files are read again for each new
// connection, so that a client certificate renewed in place is presented to
// Redis without a restart. While the files hold another authority's
// certificate, a new connection is refused by Redis (TLS 1.2, so that the
// refusal is Redis's alert in the handshake, not a later closed
// connection); once they hold the renewal, Checks succeed again, over TLS.
func TestTLSRenewedFiles(t *testing.T) {
	r := testenv.RedisServer(t, testenv.WithTLS(true))
	other := testenv.NewTLSFiles(t)
	renewedCert, renewedKey := r.TLS.RenewClient(t)
	c := r.TLS.Copy(t)
	files := tlsfiles.ClientFiles{CA: c.CA, Cert: c.ClientCert, Key: c.ClientKey}
	put := func(cert, key string) {
		testenv.CopyFile(t, cert, files.Cert)
		testenv.CopyFile(t, key, files.Key)
	}
	src, err := tlsfiles.NewClientSource(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := openBackend(t, Options{URL: "rediss://" + r.TLSAddr, KeyPrefix: "tlsr:", Timeout: testTimeout,
		TLS: func() *tls.Config {
			cfg := src.Config().Clone()
			cfg.MaxVersion = tls.VersionTLS12
			return cfg
		}})
	ctx := context.Background()
	check := func() error {
		req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 1000, Window: time.Minute}, Hits: 1}}
		return b.Check(ctx, req, make([]limiter.Result, 1))
	}
	if err := check(); err != nil {
		t.Fatalf("with the first certificate: %v", err)
	}
	// Another authority's certificate, then every connection closed: the
	// next one must present it, and is refused.
	put(other.ClientCert, other.ClientKey)
	if err := r.Client().ClientKillByFilter(ctx, "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(func() error {
		if err := check(); err == nil || !strings.Contains(err.Error(), "remote error: tls") {
			return fmt.Errorf("Check = %v, want Redis's refusal of the certificate", err)
		}
		return nil
	}); err != nil {
		t.Fatalf("with another authority's certificate in the files: %v", err)
	}
	put(renewedCert, renewedKey)
	if err := waitFor(check); err != nil {
		t.Fatalf("no successful Check after the renewal was written: %v", err)
	}
	r.CheckClientsOnTLS(t)
}
