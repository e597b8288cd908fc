package main

import (
	"log/slog"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

// tlsLoads records the loads of a set of TLS files (metrics.TLSFiles).
type tlsLoads interface {
	Loaded(initial, ok bool, notAfter time.Time)
	Restored()
}

// logTLSLoads returns the onLoad of tlsfiles.NewServer or NewClientSource
// for the files of what ("gRPC TLS", "Redis TLS"): every load is logged
// (the first with the attributes start) and recorded in tm.
func logTLSLoads(log *slog.Logger, what string, tm tlsLoads, start ...any) func(tlsfiles.Loaded) {
	return func(l tlsfiles.Loaded) {
		var attrs []any
		if l.Subject != "" {
			attrs = []any{"subject", l.Subject, "not_after", l.NotAfter.UTC().Format(time.RFC3339)}
		}
		switch {
		case l.Initial:
			log.Info(what, append(attrs, start...)...)
		case l.Restored:
			log.Info(what+": the files hold the ones in use again", attrs...)
		case l.Err != nil:
			log.Error(what+": the changed files did not load; the previous ones are still in use", append(attrs, "err", l.Err)...)
		default:
			log.Info(what+": files reloaded", attrs...)
		}
		if l.Restored {
			tm.Restored()
		} else {
			tm.Loaded(l.Initial, l.Err == nil, l.NotAfter)
		}
	}
}
