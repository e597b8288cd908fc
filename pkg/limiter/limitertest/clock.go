package limitertest

import (
	"sync/atomic"
	"time"
)

// Clock is a settable millisecond clock for tests. It is safe for
// concurrent use: backends read it through Now while the test moves it.
type Clock struct {
	ms atomic.Int64
}

// NewClock returns a Clock set to t (truncated to the millisecond).
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now returns the current instant of the clock.
func (c *Clock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// Millis returns the current instant in ms since the Unix epoch.
func (c *Clock) Millis() int64 { return c.ms.Load() }

// Set moves the clock to t (truncated to the millisecond).
func (c *Clock) Set(t time.Time) { c.ms.Store(t.UnixMilli()) }

// SetMillis moves the clock to ms since the Unix epoch.
func (c *Clock) SetMillis(ms int64) { c.ms.Store(ms) }

// Advance moves the clock forward by d (whole milliseconds).
func (c *Clock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
