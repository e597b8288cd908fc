// Package logevery bounds log lines that can repeat once per request or per
// connection: a failed check, a failed TLS handshake, a Redis client's
// complaint. Each kind of line is written at most once per interval; the
// ones in between are counted, and the next line of the kind says how many
// were held back. A kind that falls quiet with lines held back gets a line
// of its own with their number from Flush, which the Limiter's owner calls
// once per interval and, with FlushAll, at stop: no count is lost. A storm
// (every request of a busy gateway timing out, a scanner opening
// connections) costs a line per interval instead of a line per event, and
// the metrics still count every event.
package logevery

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// SuppressedKey is the attribute of a line written after lines of its kind
// were held back: their number.
const SuppressedKey = "suppressed"

// KindKey is the attribute naming the kind of a Flush line, which stands
// for lines held back rather than being one of them.
const KindKey = "kind"

// maxKinds bounds the kinds a Limiter remembers. The callers' kinds come
// from bounded sets (a gRPC code and a configured domain, a cause's class, a
// library's format string), so it is not reached in practice; a kind beyond
// it is written every time rather than forgotten.
const maxKinds = 1024

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
	// The latest line's logger, level and message, for Flush.
	log   *slog.Logger
	level slog.Level
	msg   string
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
	held, ok := l.allow(kind, log, level, msg)
	if !ok {
		return
	}
	if held > 0 {
		attrs = append(slices.Clip(attrs), slog.Int(SuppressedKey, held))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}

// allow reports whether a line of kind may be written now, and how many of
// its kind were held back since the last one.
func (l *Limiter) allow(name string, log *slog.Logger, level slog.Level, msg string) (held int, ok bool) {
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
		k = &kind{}
		l.kinds[name] = k
	case now.Before(k.next):
		k.held++
		k.log, k.level, k.msg = log, level, msg
		return 0, false
	}
	held, k.held, k.next = k.held, 0, now.Add(l.every)
	k.log, k.level, k.msg = log, level, msg
	return held, true
}

// Flush writes a line for each kind whose interval is over with lines held
// back: the latest held line's message with KindKey and SuppressedKey, their
// number. Called once per interval, it reports a storm that ended within an
// interval of its end.
func (l *Limiter) Flush(ctx context.Context) { l.flush(ctx, false) }

// FlushAll is Flush for every kind with lines held back, its interval over
// or not: for the Limiter's last use, at stop.
func (l *Limiter) FlushAll(ctx context.Context) { l.flush(ctx, true) }

func (l *Limiter) flush(ctx context.Context, all bool) {
	if l == nil || l.every <= 0 {
		return
	}
	type line struct {
		log   *slog.Logger
		level slog.Level
		msg   string
		kind  string
		held  int
	}
	var lines []line
	now := l.now()
	l.mu.Lock()
	for name, k := range l.kinds {
		if k.held == 0 || (!all && now.Before(k.next)) {
			continue
		}
		lines = append(lines, line{k.log, k.level, k.msg, name, k.held})
		k.held, k.next = 0, now.Add(l.every)
	}
	l.mu.Unlock()
	// Written outside the lock, which Log takes on every line.
	slices.SortFunc(lines, func(a, b line) int { return strings.Compare(a.kind, b.kind) })
	for _, ln := range lines {
		ln.log.LogAttrs(ctx, ln.level, ln.msg, slog.String(KindKey, ln.kind), slog.Int(SuppressedKey, ln.held))
	}
}
