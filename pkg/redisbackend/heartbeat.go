package redisbackend

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Beat records instanceID as live for ttl in the sorted set
// <prefix>instances, removes instances whose last beat expired, and returns
// how many instances are live (including this one). One script call; the
// clock is Redis TIME unless Options.Now is set. The fail-soft layer calls it
// periodically (it owns the ticker) to learn N for its 1/N share. Beat is
// safe for concurrent use; errors wrap limiter.ErrUnavailable.
func (b *Backend) Beat(ctx context.Context, instanceID string, ttl time.Duration) (live int, err error) {
	if instanceID == "" {
		return 0, errors.New("redisbackend: heartbeat: empty instance id")
	}
	ms := ttl.Milliseconds()
	if ms <= 0 {
		return 0, errors.New("redisbackend: heartbeat: ttl must be at least 1ms")
	}
	return b.beat(ctx, instanceID, ms)
}

// Leave removes instanceID from the live instances (graceful shutdown) and
// returns how many remain live.
func (b *Backend) Leave(ctx context.Context, instanceID string) (live int, err error) {
	return b.beat(ctx, instanceID, 0)
}

func (b *Backend) beat(ctx context.Context, id string, ttlMS int64) (int, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	now := ""
	if b.now != nil {
		now = strconv.FormatInt(b.now().UnixMilli(), 10)
	}
	n, err := b.scripts.heartbeat.Run(ctx, b.client, []string{b.instancesKey()}, id, strconv.FormatInt(ttlMS, 10), now).Int()
	if err != nil {
		return 0, unavailable(ctx, "heartbeat script", err)
	}
	return n, nil
}

// instancesKey is the sorted set of live instances.
func (b *Backend) instancesKey() string { return b.prefix + "instances" }
