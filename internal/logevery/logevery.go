// Package logevery bounds log lines that can repeat once per request or per
// connection: a failed check, a failed TLS handshake, a Redis client's
// complaint. Each kind of line is written at most once per interval; the
// ones in between are counted, and the next line written says how many were
// held back. A storm (every request of a busy gateway timing out, a scanner
// opening connections) costs a line per interval instead of a line per
// event, and the metrics still count every event.
package logevery

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// SuppressedKey is the attribute of a line written after lines of its kind
// were held back: their number.
const SuppressedKey = "suppressed"

// maxKinds bounds the kinds a Limiter remembers. The callers' kinds are
// fixed strings (a gRPC code, a library's format string), so it is never
// reached; a kind beyond it is written every time rather than forgotten.
const maxKinds = 256

// Limiter writes each kind of line at most once per interval. It is safe
// for concurrent use. A nil *Limiter, or one with a zero interval, writes
// every line.
type Limiter struct {
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*kind
}

// kind is what a Limiter remembers of one kind of line.
type kind struct {
	next time.Time // no line of this kind is written before then
	held int       // lines held back since the last one written
}

// New returns a Limiter that writes each kind of line at most once every
// interval (0: every line), reading the time from now (nil: time.Now).
func New(every time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{every: every, now: now, kinds: make(map[string]*kind)}
}

// Log writes msg with attrs at level through log, unless a line of the same
// kind was written less than the interval ago: then it only counts it. A line
// written after some were held back carries SuppressedKey with their number.
// Lines below log's level are neither written nor counted.
func (l *Limiter) Log(ctx context.Context, log *slog.Logger, level slog.Level, kind, msg string, attrs ...slog.Attr) {
	if !log.Enabled(ctx, level) {
		return
	}
	held, ok := l.allow(kind)
	if !ok {
		return
	}
	if held > 0 {
		attrs = append(attrs, slog.Int(SuppressedKey, held))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}

// allow reports whether a line of kind may be written now, and how many of
// its kind were held back since the last one.
func (l *Limiter) allow(name string) (held int, ok bool) {
	if l == nil || l.every <= 0 {
		return 0, true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.kinds[name]
	switch {
	case k == nil && len(l.kinds) >= maxKinds:
		return 0, true
	case k == nil:
		l.kinds[name] = &kind{next: now.Add(l.every)}
		return 0, true
	case now.Before(k.next):
		k.held++
		return 0, false
	}
	held, k.held, k.next = k.held, 0, now.Add(l.every)
	return held, true
}
