package failsoft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// veto is a request no limiter can admit (its hits exceed its capacity), so
// it consumes nothing and denies the fallback batch it is appended to; every
// other request of that batch is still reported with its own decision for
// its real hits, and nothing is consumed. See COMMON semantics: c > Capacity
// is never admitted and consumes nothing.
var veto = limiter.Request{
	Key:   "\x00failsoft:veto",
	Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1, Window: time.Millisecond},
	Hits:  2,
}

// degrade decides the batch by each request's failure mode after the primary
// could not. It fails only when a request is malformed or
// the fallback limiter itself fails.
func (l *Limiter) degrade(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	denied := false // a non-shadow deny-mode request vetoes the batch
	nfb := 0
	for i := range reqs {
		r := &reqs[i]
		if r.Key == "" {
			return fmt.Errorf("%w: request %d has an empty key", limiter.ErrInvalid, i)
		}
		if err := r.Limit.Validate(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		switch r.FailureMode {
		case limiter.FailFallback:
			nfb++
		case limiter.FailAllow:
		case limiter.FailDeny:
			if !r.Shadow {
				denied = true
			}
		default:
			return fmt.Errorf("%w: request %d: %v", limiter.ErrInvalid, i, r.FailureMode)
		}
	}

	if nfb > 0 {
		n := l.Instances()
		sub := make([]limiter.Request, 0, nfb+1)
		for i := range reqs {
			if reqs[i].FailureMode == limiter.FailFallback {
				r := reqs[i]
				r.Limit = Share(r.Limit, n)
				sub = append(sub, r)
			}
		}
		if denied {
			sub = append(sub, veto)
		}
		out := make([]limiter.Result, len(sub))
		// The in-process fallback answers in microseconds; it must answer
		// even when the caller's deadline is about to pass.
		if err := l.fallback.Check(context.WithoutCancel(ctx), sub, out); err != nil {
			return fmt.Errorf("failsoft: fallback: %w", err)
		}
		j := 0
		for i := range reqs {
			if reqs[i].FailureMode == limiter.FailFallback {
				results[i] = out[j]
				results[i].Source = limiter.SourceFallback
				j++
			}
		}
	}

	for i := range reqs {
		r := &reqs[i]
		switch r.FailureMode {
		case limiter.FailAllow:
			results[i] = limiter.Result{
				Allowed:    true,
				Remaining:  r.Limit.Capacity(),
				ResetAfter: r.Limit.Window,
				Source:     limiter.SourceFailAllow,
			}
		case limiter.FailDeny:
			results[i] = limiter.Result{
				Allowed:    false,
				ResetAfter: l.denyRetryAfter,
				RetryAfter: l.denyRetryAfter,
				Source:     limiter.SourceFailDeny,
			}
		}
	}
	return nil
}

// Share returns this instance's share of lim when n instances share it:
// Requests, and a token bucket's explicit Burst, divided by n and rounded
// down, but at least 1. Window and Algorithm are kept, so the fallback
// counter's identity (key, algorithm, window) does not change with n.
//
// Rounding down means n instances together admit at most
// n·max(1, ⌊L/n⌋) per window: never more than L when L ≥ n, at most n−1
// fewer than L in total (L mod n is lost); when L < n every instance still
// admits 1, so the total may reach n.
func Share(lim limiter.Limit, n int) limiter.Limit {
	if n <= 1 {
		return lim
	}
	lim.Requests = max(1, lim.Requests/uint64(n))
	if lim.Algorithm == limiter.TokenBucket && lim.Burst > 0 {
		lim.Burst = max(1, lim.Burst/uint64(n))
	}
	return lim
}

// kinded is implemented by errors that know their own store-error kind.
type kinded interface{ StoreErrorKind() string }

// errorKind classifies a store error for Observer.StoreError: an error in the
// chain implementing StoreErrorKind() string names itself; otherwise "tls"
// (a failure of TLS itself), "timeout", "connection",
// "cluster" (a topology change: CLUSTERDOWN, TRYAGAIN, MOVED/ASK, READONLY,
// MASTERDOWN, LOADING, no reachable master) or "other".
func errorKind(err error) string {
	var k kinded
	if errors.As(err, &k) {
		return k.StoreErrorKind()
	}
	msg := err.Error()
	var ne net.Error
	switch {
	case strings.Contains(msg, "tls: "):
		// TLS itself failed: our end did not verify the server's
		// certificate (an unknown authority, another name, expired), an
		// alert came from either end (the server refused our certificate,
		// a record did not decrypt), or the server does not speak TLS.
		// crypto/tls words every error of its own "tls: …" (an alert
		// "remote error: tls: …" or "local error: tls: …"), and the store
		// keeps the message. When Redis refuses our certificate, TLS 1.3
		// tells us only at our first read, and a write that comes first
		// meets the closed connection: "connection" below (TLS 1.2 ends
		// the handshake with the alert). So does a Redis that closes a
		// plain connection on its TLS port.
		return "tls"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed):
		return "connection"
	}
	for _, s := range []string{"CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK ", "READONLY", "MASTERDOWN", "LOADING", "cluster", "sentinel", "master"} {
		if strings.Contains(msg, s) {
			return "cluster"
		}
	}
	var oe *net.OpError
	if errors.As(err, &oe) || strings.Contains(msg, "connection") {
		return "connection"
	}
	return "other"
}
