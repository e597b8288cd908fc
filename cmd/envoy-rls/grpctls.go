package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// grpcTLSOptions are the --grpc.tls.* flags: TLS on the gRPC listener,
// mutual when a client authority is set.
type grpcTLSOptions struct {
	cert, key, clientCA string
	clientSANs          listFlag
}

func (o *grpcTLSOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.cert, "grpc.tls.cert", "", "PEM certificate (with its chain) the gRPC listener presents: serve TLS (with --grpc.tls.key); renewed files are read at the next handshake")
	fs.StringVar(&o.key, "grpc.tls.key", "", "PEM key of --grpc.tls.cert")
	fs.StringVar(&o.clientCA, "grpc.tls.client-ca", "", "PEM file of the authorities that sign client certificates: every client must present one (mutual TLS; needs --grpc.tls.cert)")
	fs.Var(&o.clientSANs, "grpc.tls.client-san", "names a client certificate must carry one of, comma-separated: host names or IP addresses it is valid for (a wildcard DNS name covers its subdomains), URIs (a SPIFFE ID) or e-mail addresses (needs --grpc.tls.client-ca)")
}

// check refuses a partial setting, naming the flags.
func (o grpcTLSOptions) check() error {
	switch {
	case (o.cert == "") != (o.key == ""):
		return usageError{msg: "--grpc.tls.cert and --grpc.tls.key go together: set both to serve TLS, or neither"}
	case o.clientCA != "" && o.cert == "":
		return usageError{msg: "--grpc.tls.client-ca is set, but TLS is off: set --grpc.tls.cert and --grpc.tls.key"}
	case len(o.clientSANs) > 0 && o.clientCA == "":
		return usageError{msg: "--grpc.tls.client-san is set, but no --grpc.tls.client-ca: client names are checked only in certificates an authority verified"}
	}
	return nil
}

// serverOption returns the gRPC server option that serves TLS with the
// --grpc.tls.* files (reading renewed files at the next handshake), logging
// and counting every load and failed handshake; nil when TLS is off.
func (o grpcTLSOptions) serverOption(log *slog.Logger, m *metrics.Metrics) (grpc.ServerOption, error) {
	if o.cert == "" {
		return nil, nil
	}
	tm, err := m.ListenerTLS()
	if err != nil {
		return nil, err
	}
	files := tlsfiles.ServerFiles{Cert: o.cert, Key: o.key, ClientCA: o.clientCA, ClientSANs: o.clientSANs}
	srv, err := tlsfiles.NewServer(files, func(l tlsfiles.Loaded) {
		tm.Loaded(l.Initial, l.Err == nil, l.NotAfter)
		attrs := []any{"subject", l.Subject, "not_after", l.NotAfter.UTC().Format(time.RFC3339)}
		switch {
		case l.Initial:
			log.Info("gRPC TLS", append(attrs, "cert", o.cert, "mutual", o.clientCA != "", "client_sans", o.clientSANs.String())...)
		case l.Err != nil:
			log.Error("gRPC TLS: the changed files did not load; the previous certificate is still served", append(attrs, "err", l.Err)...)
		default:
			log.Info("gRPC TLS: files reloaded", attrs...)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("--grpc.tls.*: %w", err)
	}
	creds := handshakeObserver{
		TransportCredentials: credentials.NewTLS(srv.Config()),
		failed: func(client net.Addr, err error) {
			if errors.Is(err, io.EOF) {
				// Closed before a hello: a TCP probe, not a TLS failure.
				log.Debug("gRPC TLS: connection closed before its handshake", "client", client.String())
				return
			}
			tm.HandshakeFailed()
			log.Warn("gRPC TLS: handshake failed", "client", client.String(), "err", err)
		},
	}
	return grpc.Creds(creds), nil
}

// handshakeObserver is gRPC's TLS credentials, telling failed of every
// server handshake that fails (grpc-go closes those connections with a
// log line of its own only).
type handshakeObserver struct {
	credentials.TransportCredentials
	failed func(client net.Addr, err error)
}

func (h handshakeObserver) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := h.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		h.failed(conn.RemoteAddr(), err)
	}
	return out, info, err
}

func (h handshakeObserver) Clone() credentials.TransportCredentials {
	return handshakeObserver{TransportCredentials: h.TransportCredentials.Clone(), failed: h.failed}
}
