package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// grpcServerTLS returns the gRPC server option that serves TLS with the
// --grpc.tls.* files (reading renewed files at the next handshake), logging
// and counting every load and failed handshake; nil when TLS is off.
func grpcServerTLS(files tlsfiles.ServerFiles, log *slog.Logger, m *metrics.Metrics) (grpc.ServerOption, error) {
	if files.Cert == "" {
		return nil, nil
	}
	tm, err := m.ListenerTLS()
	if err != nil {
		return nil, err
	}
	srv, err := tlsfiles.NewServer(files, func(l tlsfiles.Loaded) {
		tm.Loaded(l.Initial, l.Err == nil, l.NotAfter)
		attrs := []any{"subject", l.Subject, "not_after", l.NotAfter.UTC().Format(time.RFC3339)}
		switch {
		case l.Initial:
			log.Info("gRPC TLS", append(attrs, "cert", files.Cert, "mutual", files.ClientCA != "", "client_sans", strings.Join(files.ClientSANs, ","))...)
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
