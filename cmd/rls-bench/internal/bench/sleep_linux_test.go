package bench

import (
	"context"
	"testing"
	"time"
)

func TestSleepUntilReturnsAtTheInstant(t *testing.T) {
	// A clock that reaches the instant on its third reading: sleepUntil
	// must keep sleeping (in steps of at most maxSleep) until then.
	base := time.Unix(1000, 0)
	readings := 0
	now := func() time.Time {
		readings++
		if readings >= 3 {
			return base.Add(time.Hour)
		}
		return base
	}
	if err := sleepUntil(context.Background(), now, base.Add(time.Millisecond)); err != nil {
		t.Fatalf("sleepUntil: %v", err)
	}
	if readings != 3 {
		t.Errorf("clock read %d times, want 3 (two sleeps, then the instant)", readings)
	}
}
