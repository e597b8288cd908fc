package redisbackend

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/envoy-rls/envoy-rls/internal/logevery"
)

// SetClientLogger sends the lines go-redis writes by itself (a dial that
// failed after its retries, a Sentinel's new master, a Cluster's moved
// slots) to log at Warn, with "component" set to "go-redis", instead of
// go-redis's own plain-text lines on standard error, which ignore the
// service's log level and format. Each kind of line (go-redis's format
// string) is written at most once per every, the next one saying how many
// were held back (logevery); zero writes every line.
//
// go-redis has one logger per process, so this sets it for every client:
// call it once, from main. A nil log restores go-redis's own.
func SetClientLogger(log *slog.Logger, every time.Duration) {
	if log == nil {
		logging.Enable()
		return
	}
	redis.SetLogger(clientLogger{log: log.With("component", "go-redis"), every: logevery.New(every, nil)})
}

// clientLogger is go-redis's logger interface on a slog.Logger.
type clientLogger struct {
	log   *slog.Logger
	every *logevery.Limiter
}

// Printf writes one go-redis line. Its "redis: " prefix says what
// "component" says already.
func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	c.every.Log(ctx, c.log, slog.LevelWarn, format, msg)
}
