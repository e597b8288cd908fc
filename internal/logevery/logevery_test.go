package logevery

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// clock is a settable time for a Limiter.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// record is one JSON log line.
type record struct {
	Msg        string `json:"msg"`
	Level      string `json:"level"`
	Kind       string `json:"kind"`
	Suppressed *int   `json:"suppressed"`
	I          *int   `json:"i"`
}

// jsonLog returns a logger writing JSON lines at level to a buffer, and a
// function that decodes what it wrote.
func jsonLog(t *testing.T, level slog.Level) (*slog.Logger, func() []record) {
	t.Helper()
	var buf testenv.Buffer
	lines := func() []record {
		var out []record
		dec := json.NewDecoder(strings.NewReader(buf.String()))
		for dec.More() {
			var r record
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("log line: %v\n%s", err, buf.String())
			}
			out = append(out, r)
		}
		return out
	}
	return slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})), lines
}

func suppressed(r record) int {
	if r.Suppressed == nil {
		return 0
	}
	return *r.Suppressed
}

func TestOneLinePerIntervalPerKind(t *testing.T) {
	var c clock
	c.advance(time.Hour)
	log, lines := jsonLog(t, slog.LevelInfo)
	l := New(10*time.Second, c.now)
	ctx := context.Background()
	emit := func(kind string, n int) {
		for i := range n {
			l.Log(ctx, log, slog.LevelWarn, kind, "failed", slog.String("kind", kind), slog.Int("i", i))
		}
	}

	emit("a", 5) // the first is written, 4 held
	emit("b", 2) // another kind: its own first line, 1 held
	c.advance(9 * time.Second)
	emit("a", 3) // still inside a's interval: 7 held
	c.advance(time.Second)
	emit("a", 1) // a's interval is over: written with suppressed=7
	emit("a", 1) // held: a new interval began at the line just written
	c.advance(10 * time.Second)
	emit("b", 1) // written with suppressed=1
	emit("c", 1)
	emit("a", 1) // a's interval is over too: suppressed=1, the one held since its last line

	type want struct {
		kind       string
		suppressed int
	}
	wants := []want{{"a", 0}, {"b", 0}, {"a", 7}, {"b", 1}, {"c", 0}, {"a", 1}}
	got := lines()
	if len(got) != len(wants) {
		t.Fatalf("%d lines written, want %d: %+v", len(got), len(wants), got)
	}
	for i, w := range wants {
		if got[i].Kind != w.kind || suppressed(got[i]) != w.suppressed || got[i].Level != "WARN" || got[i].Msg != "failed" {
			t.Errorf("line %d: %+v (suppressed %d), want a WARN \"failed\" of kind %s with suppressed %d",
				i, got[i], suppressed(got[i]), w.kind, w.suppressed)
		}
		if w.suppressed == 0 && got[i].Suppressed != nil {
			t.Errorf("line %d carries suppressed=0; the attribute should be absent", i)
		}
	}
}

func TestEveryLineWithoutAnInterval(t *testing.T) {
	for name, l := range map[string]*Limiter{"nil": nil, "zero": New(0, nil)} {
		t.Run(name, func(t *testing.T) {
			log, lines := jsonLog(t, slog.LevelInfo)
			for range 5 {
				l.Log(context.Background(), log, slog.LevelWarn, "k", "again")
			}
			if got := lines(); len(got) != 5 {
				t.Fatalf("%d lines written, want all 5", len(got))
			}
		})
	}
}

func TestLinesBelowTheLevelAreNotCounted(t *testing.T) {
	var c clock
	log, lines := jsonLog(t, slog.LevelWarn)
	l := New(time.Minute, c.now)
	ctx := context.Background()
	for range 3 {
		l.Log(ctx, log, slog.LevelInfo, "k", "quiet")
	}
	l.Log(ctx, log, slog.LevelWarn, "k", "loud")
	got := lines()
	if len(got) != 1 || got[0].Msg != "loud" || got[0].Suppressed != nil {
		t.Fatalf("got %+v, want one line \"loud\" without suppressed (info lines are off, so not held back)", got)
	}
}

// TestConcurrentCountIsExact logs one kind from many goroutines: one line is
// written, and the next one's count accounts for every other.
func TestConcurrentCountIsExact(t *testing.T) {
	var c clock
	log, lines := jsonLog(t, slog.LevelInfo)
	l := New(time.Second, c.now)
	const goroutines, each = 16, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				l.Log(context.Background(), log, slog.LevelWarn, "k", "storm", slog.Int("g", g), slog.Int("i", i))
			}
		})
	}
	wg.Wait()
	c.advance(time.Second)
	l.Log(context.Background(), log, slog.LevelWarn, "k", "storm")
	got := lines()
	if len(got) != 2 {
		t.Fatalf("%d lines written, want 2 (the storm's first and the one after the interval)", len(got))
	}
	if n := suppressed(got[1]); n != goroutines*each-1 {
		t.Fatalf("suppressed = %d, want %d", n, goroutines*each-1)
	}
}

func TestKindsBeyondTheBoundAreWrittenEveryTime(t *testing.T) {
	var c clock
	log, lines := jsonLog(t, slog.LevelInfo)
	l := New(time.Minute, c.now)
	ctx := context.Background()
	for i := range maxKinds {
		l.Log(ctx, log, slog.LevelWarn, fmt.Sprint(i), "first")
	}
	for range 3 {
		l.Log(ctx, log, slog.LevelWarn, "one too many", "beyond")
		l.Log(ctx, log, slog.LevelWarn, "0", "held")
	}
	got := lines()
	if len(got) != maxKinds+3 {
		t.Fatalf("%d lines, want %d: the remembered kinds once each, the kind beyond the bound every time", len(got), maxKinds+3)
	}
	for _, r := range got[maxKinds:] {
		if r.Msg != "beyond" {
			t.Fatalf("line %+v written: a remembered kind inside its interval must be held", r)
		}
	}
}

// TestFlushReportsAQuietKind: lines held back when their kind falls quiet
// are reported by Flush once the interval is over, and by FlushAll at once;
// nothing is reported twice, and a kind without held lines gets none.
func TestFlushReportsAQuietKind(t *testing.T) {
	var c clock
	log, lines := jsonLog(t, slog.LevelInfo)
	l := New(10*time.Second, c.now)
	ctx := context.Background()
	for i := range 4 {
		l.Log(ctx, log, slog.LevelWarn, "a", "storm", slog.Int("i", i))
	}
	l.Log(ctx, log, slog.LevelError, "b", "once")
	l.Log(ctx, log, slog.LevelInfo, "c", "twice")
	l.Log(ctx, log, slog.LevelInfo, "c", "twice")
	l.Flush(ctx) // inside every interval: nothing
	if got := lines(); len(got) != 3 {
		t.Fatalf("%d lines before the interval is over, want 3 (a, b and c's first): %+v", len(got), got)
	}
	c.advance(10 * time.Second)
	l.Flush(ctx)
	l.Flush(ctx) // reported once
	got := lines()[3:]
	if len(got) != 2 {
		t.Fatalf("Flush wrote %+v, want one line for a and one for c", got)
	}
	if got[0].Msg != "storm" || got[0].Level != "WARN" || got[0].Kind != "a" || suppressed(got[0]) != 3 || got[0].I != nil {
		t.Errorf("a's flush line %+v: want storm at WARN, kind a, suppressed 3, without a held line's attributes", got[0])
	}
	if got[1].Msg != "twice" || got[1].Level != "INFO" || got[1].Kind != "c" || suppressed(got[1]) != 1 {
		t.Errorf("c's flush line %+v: want twice at INFO, kind c, suppressed 1", got[1])
	}

	// FlushAll does not wait for the interval; a new line of a flushed
	// kind is held again (a line per interval at most).
	l.Log(ctx, log, slog.LevelWarn, "a", "storm")
	l.Log(ctx, log, slog.LevelWarn, "a", "storm")
	l.FlushAll(ctx)
	got = lines()[5:]
	if len(got) != 1 || got[0].Kind != "a" || suppressed(got[0]) != 2 {
		t.Fatalf("FlushAll wrote %+v, want a's line with suppressed 2", got)
	}
	l.FlushAll(ctx)
	if n := len(lines()); n != 6 {
		t.Fatalf("a second FlushAll wrote %d lines", n-6)
	}
}

// TestAQuietGapDoesNotOpenABurst: after a gap longer than the interval, one
// line is written and the next ones are held again, rather than a line for
// each interval the gap spanned.
func TestAQuietGapDoesNotOpenABurst(t *testing.T) {
	var c clock
	log, lines := jsonLog(t, slog.LevelInfo)
	l := New(time.Second, c.now)
	ctx := context.Background()
	l.Log(ctx, log, slog.LevelWarn, "k", "x")
	c.advance(time.Minute)
	for range 5 {
		l.Log(ctx, log, slog.LevelWarn, "k", "x")
	}
	if got := lines(); len(got) != 2 {
		t.Fatalf("%d lines, want 2: the first, and one after the gap", len(got))
	}
}
