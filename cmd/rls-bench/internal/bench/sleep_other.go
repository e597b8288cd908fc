//go:build !linux

package bench

import (
	"context"
	"time"
)

// sleepUntil returns when now() reaches t, or ctx's error if ctx ends first.
// It sleeps on a Go timer, which may wake up to a millisecond late (see
// sleep_linux.go), so open-loop latencies at high rates include that
// lateness on this platform.
func sleepUntil(ctx context.Context, now func() time.Time, t time.Time) error {
	wait := t.Sub(now())
	if wait <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
