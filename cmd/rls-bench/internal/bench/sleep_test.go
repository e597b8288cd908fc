package bench

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleepUntilStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	base := time.Unix(1000, 0)
	err := sleepUntil(ctx, func() time.Time { return base }, base.Add(time.Hour))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("sleepUntil with a cancelled context = %v, want context.Canceled", err)
	}
}
