package redisbackend

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

// LineLimiter writes log lines of one kind at most so often
// (internal/logevery.Limiter).
type LineLimiter interface {
	Log(ctx context.Context, log *slog.Logger, level slog.Level, kind, msg string, attrs ...slog.Attr)
}

// SetClientLogger sends the lines go-redis writes by itself to log, with
// "component" set to "go-redis", instead of go-redis's own plain-text lines
// on standard error, which ignore the service's log level and format:
//   - a Sentinel's news (the master it found or a new one after a failover,
//     a Sentinel it discovered) at Info, every one: they are state changes;
//   - a panic go-redis recovered from at Error, through lines;
//   - everything else (a dial that failed after its retries, a pool that
//     found no usable connection) at Warn, through lines.
//
// lines bounds each kind of line, go-redis's format string, to one per
// interval (nil: every line). go-redis's lines carry their values in the
// message, so the format is their kind.
//
// go-redis has one logger per process, so this sets it for every client in
// the process: the last call wins. A nil log restores go-redis's own.
func SetClientLogger(log *slog.Logger, lines LineLimiter) {
	if log == nil {
		logging.Enable()
		return
	}
	redis.SetLogger(clientLogger{log: log.With("component", "go-redis"), lines: lines})
}

// clientLogger is go-redis's logger interface on a slog.Logger.
type clientLogger struct {
	log   *slog.Logger
	lines LineLimiter
}

// sentinelNews are the formats of go-redis's Sentinel state changes.
var sentinelNews = []string{"sentinel: new master", "sentinel: selected addr", "sentinel: discovered new sentinel"}

// Printf writes one go-redis line. Its "redis: " prefix says what
// "component" says already.
func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	for _, news := range sentinelNews {
		if strings.HasPrefix(format, news) {
			c.log.LogAttrs(ctx, slog.LevelInfo, msg)
			return
		}
	}
	level := slog.LevelWarn
	if strings.Contains(format, "panic") {
		level = slog.LevelError
	}
	if c.lines == nil {
		c.log.LogAttrs(ctx, level, msg)
		return
	}
	c.lines.Log(ctx, c.log, level, format, msg)
}
