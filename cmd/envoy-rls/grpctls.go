package main

import (
	"errors"
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
// and counting every load and failed handshake; nil when TLS is off. A
// file that does not load is a usageError.
func grpcServerTLS(files tlsfiles.ServerFiles, log *slog.Logger, m *metrics.Metrics) (grpc.ServerOption, error) {
	if files.Cert == "" {
		return nil, nil
	}
	tm, err := m.ListenerTLS()
	if err != nil {
		return nil, err
	}
	srv, err := tlsfiles.NewServer(files, func(l tlsfiles.Loaded) {
		attrs := []any{"subject", l.Subject, "not_after", l.NotAfter.UTC().Format(time.RFC3339)}
		switch {
		case l.Initial:
			log.Info("gRPC TLS", append(attrs, "cert", files.Cert, "mutual", files.ClientCA != "", "client_sans", strings.Join(files.ClientSANs, ","))...)
		case l.Restored:
			log.Info("gRPC TLS: the files hold the served certificate again", attrs...)
		case l.Err != nil:
			log.Error("gRPC TLS: the changed files did not load; the previous certificate is still served", append(attrs, "err", l.Err)...)
		default:
			log.Info("gRPC TLS: files reloaded", attrs...)
		}
		if l.Restored {
			tm.Restored()
		} else {
			tm.Loaded(l.Initial, l.Err == nil, l.NotAfter)
		}
	})
	if err != nil {
		return nil, usageError{msg: "--grpc.tls.*: " + err.Error()}
	}
	return grpc.Creds(handshakeObserver{TransportCredentials: credentials.NewTLS(srv.Config()), log: log, tm: tm}), nil
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
