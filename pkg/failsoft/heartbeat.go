package failsoft

import (
	"context"
	"time"
)

// Run announces this instance through Options.Heartbeat every
// HeartbeatInterval (with a time to live of three intervals) and, unless
// Options.Instances overrides it, stores the number of live instances the
// store reports. A failed beat keeps the last known number. Changes are
// logged once each. Run beats once at once; when ctx ends it withdraws this
// instance (if the Heartbeat has a Leave(ctx, id) (int, error) method, as
// pkg/redisbackend's does) and returns nil. It returns nil at once when there
// is no Heartbeat. The owner calls it once, in
// its own goroutine, and stops it by cancelling ctx.
func (l *Limiter) Run(ctx context.Context) error {
	if l.hb == nil {
		return nil
	}
	t := time.NewTicker(l.interval)
	defer t.Stop()
	failing := false
	for {
		failing = l.beat(ctx, failing)
		select {
		case <-ctx.Done():
			l.leave(ctx)
			return nil
		case <-t.C:
		}
	}
}

// leaver is implemented by a Heartbeat that can withdraw an instance at
// once (pkg/redisbackend's Leave), so the others' share grows without
// waiting for the heartbeat to expire.
type leaver interface {
	Leave(ctx context.Context, id string) (int, error)
}

// leave withdraws this instance when the Heartbeat supports it, bounded by
// one interval.
func (l *Limiter) leave(ctx context.Context) {
	lv, ok := l.hb.(leaver)
	if !ok {
		return
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.interval)
	defer cancel()
	if _, err := lv.Leave(lctx, l.id); err != nil {
		l.log.Warn("heartbeat: could not withdraw this instance; it is counted until its heartbeat expires",
			"error", err, "ttl", 3*l.interval)
	}
}

// beat sends one heartbeat; failing says whether the previous one failed,
// and the result whether this one did.
func (l *Limiter) beat(ctx context.Context, failing bool) bool {
	bctx, cancel := context.WithTimeout(ctx, l.interval)
	defer cancel()
	n, err := l.hb.Beat(bctx, l.id, 3*l.interval)
	if err != nil {
		if ctx.Err() != nil {
			return failing
		}
		if !failing {
			l.log.Warn("heartbeat failed: keeping the last known number of instances",
				"error", err, "instances", l.Instances())
		}
		return true
	}
	if failing {
		l.log.Info("heartbeat succeeded again", "live", n)
	}
	n = max(n, 1) // this instance is alive, whatever the store says
	if old := l.live.Swap(int64(n)); old != int64(n) {
		if l.override > 0 {
			l.log.Info("live instances changed (fallback share fixed by the instances override)",
				"live", n, "previous", old, "instances", l.override)
		} else {
			l.log.Info("live instances changed: fallback share is 1/live of each limit",
				"live", n, "previous", old)
		}
	}
	return false
}
