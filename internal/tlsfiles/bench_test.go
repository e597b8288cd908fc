package tlsfiles_test

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

// BenchmarkHandshake measures one whole TLS handshake (TLS 1.3, ECDSA P-256,
// both ends in this process, over loopback TCP) with the server's configuration
// static (the certificate loaded once) and with a Server's, which reads and
// hashes its files at each handshake: the difference is what reading the
// files costs a new connection. "mutual" adds a client certificate and a
// client authority.
func BenchmarkHandshake(b *testing.B) {
	a := testenv.NewTLSFiles(b)
	for _, mutual := range []bool{false, true} {
		files := tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key}
		client := tlsfiles.ClientFiles{CA: a.CA, ServerName: "localhost"}
		name := "server-only"
		if mutual {
			files.ClientCA = a.CA
			client.Cert, client.Key = a.ClientCert, a.ClientKey
			name = "mutual"
		}
		srv, err := tlsfiles.NewServer(files, nil)
		if err != nil {
			b.Fatal(err)
		}
		static, err := srv.Config().GetConfigForClient(nil)
		if err != nil {
			b.Fatal(err)
		}
		clientCfg, err := tlsfiles.Client(client)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name string
			cfg  *tls.Config
		}{{"static", static}, {"files", srv.Config()}} {
			b.Run(name+"/"+c.name, func(b *testing.B) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				defer ln.Close()
				for b.Loop() {
					handshakeLoopback(b, ln, c.cfg, clientCfg)
				}
			})
		}
	}
}

// BenchmarkConfig measures what a handshake (Server) or a new connection
// (ClientSource) spends on the files alone when they did not change:
// reading and hashing them, and the comparison.
func BenchmarkConfig(b *testing.B) {
	a := testenv.NewTLSFiles(b)
	srv, err := tlsfiles.NewServer(tlsfiles.ServerFiles{Cert: a.Cert, Key: a.Key, ClientCA: a.CA}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("server", func(b *testing.B) {
		cfg := srv.Config()
		for b.Loop() {
			if _, err := cfg.GetConfigForClient(nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	src, err := tlsfiles.NewClientSource(tlsfiles.ClientFiles{CA: a.CA, Cert: a.ClientCert, Key: a.ClientKey}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("client", func(b *testing.B) {
		for b.Loop() {
			src.Config()
		}
	})
}

// handshakeLoopback runs one handshake between a server with srv and a
// client with client over a loopback TCP connection from ln. It is the
// tests' handshake without what they observe (the certificates each end
// saw, and a read that waits for TLS 1.3's verdict on the client's
// certificate), so that the benchmark times the handshake alone.
func handshakeLoopback(b *testing.B, ln net.Listener, srv, client *tls.Config) {
	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		done <- tls.Server(conn, srv).Handshake()
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err == nil {
		c.Close()
	}
	if serr := <-done; err != nil || serr != nil {
		b.Fatalf("handshake: client %v, server %v", err, serr)
	}
}
