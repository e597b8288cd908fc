package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/envoy-rls/envoy-rls/internal/logevery"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// grpcServerTLS returns the gRPC server option that serves TLS with the
// --grpc.tls.* files (reading renewed files at the next handshake), logging
// every load, counting every load and failed handshake and logging the
// failed handshakes through lines, and check, which reads the files
// between handshakes; nils when TLS is off. A file that does not load is a
// usageError.
func grpcServerTLS(files tlsfiles.ServerFiles, log *slog.Logger, lines *logevery.Limiter, m *metrics.Metrics) (opt grpc.ServerOption, check func(), err error) {
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
	return grpc.Creds(handshakeObserver{TransportCredentials: credentials.NewTLS(srv.Config()), log: log, lines: lines, tm: tm}), srv.Check, nil
}

// handshakeObserver is gRPC's TLS credentials, counting every server
// handshake that fails and logging it through lines (grpc-go closes those
// connections with a log line of its own only), a kind per class of cause:
// a scanner, or an Envoy with the wrong certificate reconnecting, fails a
// handshake per connection, and one cause must not hide another.
type handshakeObserver struct {
	credentials.TransportCredentials
	log   *slog.Logger
	lines *logevery.Limiter
	tm    *metrics.ListenerTLS
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
		cause := handshakeCause(err)
		h.lines.Log(context.Background(), h.log, slog.LevelWarn, "TLS handshake: "+cause, "gRPC TLS: handshake failed",
			slog.String("client", conn.RemoteAddr().String()), slog.String("cause", cause), slog.Any("err", err))
		h.tm.HandshakeFailed()
	}
	return out, info, err
}

// handshakeCause is the class of a failed server handshake's error.
func handshakeCause(err error) string {
	var (
		header tls.RecordHeaderError
		op     *net.OpError
		verify *tls.CertificateVerificationError
		name   *tlsfiles.ClientNameError
	)
	switch {
	case errors.As(err, &header):
		return "not TLS" // plain text, or another protocol
	case errors.As(err, &op) && op.Op == "remote error":
		// crypto/tls's error for an alert received: the client refused
		// our certificate, or the protocol.
		return "client alert"
	case errors.As(err, &verify), errors.As(err, &name):
		return "client certificate" // unverified, or of another name
	}
	return "other" // no client certificate, no common version or cipher, ...
}

func (h handshakeObserver) Clone() credentials.TransportCredentials {
	return handshakeObserver{TransportCredentials: h.TransportCredentials.Clone(), log: h.log, lines: h.lines, tm: h.tm}
}
