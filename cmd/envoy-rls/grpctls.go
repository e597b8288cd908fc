package main

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// grpcServerTLS returns the gRPC server option that serves TLS with the
// --grpc.tls.* files (reading renewed files at the next handshake), logging
// and counting every load and failed handshake, and check, which reads the
// files between handshakes; nils when TLS is off. A file that does not load
// is a usageError.
func grpcServerTLS(files tlsfiles.ServerFiles, log *slog.Logger, m *metrics.Metrics) (opt grpc.ServerOption, check func(), err error) {
	if files.Cert == "" {
		return nil, nil, nil
	}
	tm, err := m.ListenerTLS()
	if err != nil {
		return nil, nil, err
	}
	srv, err := tlsfiles.NewServer(files, logTLSLoads(log, "gRPC TLS", tm,
		"cert", files.Cert, "mutual", files.ClientCA != "", "client_sans", strings.Join(files.ClientSANs, ",")))
	if err != nil {
		return nil, nil, usageError{msg: "--grpc.tls.*: " + err.Error()}
	}
	return grpc.Creds(handshakeObserver{TransportCredentials: credentials.NewTLS(srv.Config()), log: log, tm: tm}), srv.Check, nil
}

// handshakeObserver is gRPC's TLS credentials, logging and counting every
// server handshake that fails (grpc-go closes those connections with a log
// line of its own only).
type handshakeObserver struct {
	credentials.TransportCredentials
	log *slog.Logger
	tm  *metrics.ListenerTLS
}

func (h handshakeObserver) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := h.TransportCredentials.ServerHandshake(conn)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		// Closed without a word, before its hello or without an alert: a
		// TCP probe, most likely (grpc-go does not log these either).
		h.log.Debug("gRPC TLS: connection closed during its handshake", "client", conn.RemoteAddr().String())
	default:
		h.log.Warn("gRPC TLS: handshake failed", "client", conn.RemoteAddr().String(), "err", err)
		h.tm.HandshakeFailed()
	}
	return out, info, err
}

func (h handshakeObserver) Clone() credentials.TransportCredentials {
	return handshakeObserver{TransportCredentials: h.TransportCredentials.Clone(), log: h.log, tm: h.tm}
}
