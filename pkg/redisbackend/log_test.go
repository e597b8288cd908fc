package redisbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/logevery"
	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestClientLinesGoToTheLogger pings an address nothing listens on: the
// line go-redis writes for each failed dial reaches the service's logger as
// a JSON record at WARN with component go-redis, once per interval.
func TestClientLinesGoToTheLogger(t *testing.T) {
	for _, c := range []struct {
		every time.Duration
		lines int
	}{
		{0, 3},         // every failed dial
		{time.Hour, 1}, // the first; the others are held back
	} {
		t.Run(c.every.String(), func(t *testing.T) {
			var buf testenv.Buffer
			SetClientLogger(slog.New(slog.NewJSONHandler(&buf, nil)), logevery.New(c.every, nil))
			t.Cleanup(func() { SetClientLogger(nil, nil) })
			b := newOnURL(t, "redis://"+testenv.FreeAddr(t), "t:", nil)
			for range 3 {
				if err := b.Ping(context.Background()); err == nil {
					t.Fatal("Ping succeeded with nothing listening")
				}
			}
			var dials []map[string]any
			dec := json.NewDecoder(bytes.NewReader([]byte(buf.String())))
			for dec.More() {
				var r map[string]any
				if err := dec.Decode(&r); err != nil {
					t.Fatalf("a line that is no JSON record: %v\n%s", err, buf.String())
				}
				if r["component"] != "go-redis" || r["level"] != "WARN" {
					t.Errorf("record %v: want component go-redis at WARN", r)
				}
				msg, _ := r["msg"].(string)
				if strings.HasPrefix(msg, "redis:") {
					t.Errorf("message %q keeps go-redis's prefix", msg)
				}
				if strings.HasPrefix(msg, "connection pool: failed to dial") {
					dials = append(dials, r)
				}
			}
			if len(dials) != c.lines {
				t.Fatalf("%d failed-dial lines for 3 failed dials, want %d:\n%s", len(dials), c.lines, buf.String())
			}
		})
	}
}

// TestClientLineLevels: a Sentinel's news is a state change, written at
// Info every time; a recovered panic is an Error; the rest are warnings,
// bounded by their format.
func TestClientLineLevels(t *testing.T) {
	var buf testenv.Buffer
	c := clientLogger{log: slog.New(slog.NewJSONHandler(&buf, nil)), lines: logevery.New(time.Hour, nil)}
	ctx := context.Background()
	c.Printf(ctx, "sentinel: new master=%q addr=%q", "m", "10.0.0.1:6379")
	c.Printf(ctx, "sentinel: new master=%q addr=%q", "m", "10.0.0.2:6379")
	c.Printf(ctx, "sentinel: selected addr=%s masterAddr=%s", "s:26379", "10.0.0.2:6379")
	c.Printf(ctx, "autopipeline: recovered full-duplex write panic: %v\n%s", "boom", "stack")
	c.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 1, "refused")
	c.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 1, "refused")
	c.Printf(nil, "redis: connection pool: failed to get a usable connection after %d attempts", 3) //nolint:staticcheck // go-redis passes nil contexts too

	want := []struct{ level, msg string }{
		{"INFO", `sentinel: new master="m" addr="10.0.0.1:6379"`},
		{"INFO", `sentinel: new master="m" addr="10.0.0.2:6379"`},
		{"INFO", "sentinel: selected addr=s:26379 masterAddr=10.0.0.2:6379"},
		{"ERROR", "autopipeline: recovered full-duplex write panic: boom\nstack"},
		{"WARN", "connection pool: failed to dial after 1 attempts: refused"},
		{"WARN", "connection pool: failed to get a usable connection after 3 attempts"},
	}
	var got []map[string]any
	dec := json.NewDecoder(strings.NewReader(buf.String()))
	for dec.More() {
		var r map[string]any
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), buf.String())
	}
	for i, w := range want {
		if got[i]["level"] != w.level || got[i]["msg"] != w.msg {
			t.Errorf("line %d: %v %q, want %s %q", i, got[i]["level"], got[i]["msg"], w.level, w.msg)
		}
	}
}

// TestClientLoggerRestored: SetClientLogger(nil, nil) gives go-redis its
// own logger back: its lines go to standard error, and the service's logger
// hears no more of them.
func TestClientLoggerRestored(t *testing.T) {
	var buf testenv.Buffer
	SetClientLogger(slog.New(slog.NewJSONHandler(&buf, nil)), nil)
	// go-redis's own logger writes to the standard error of the moment it
	// is made: a file here, and the real one again when the test ends.
	stderr, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	real := os.Stderr
	os.Stderr = stderr
	SetClientLogger(nil, nil)
	os.Stderr = real
	t.Cleanup(func() { SetClientLogger(nil, nil) })

	b := newOnURL(t, "redis://"+testenv.FreeAddr(t), "t:", nil)
	if err := b.Ping(context.Background()); err == nil {
		t.Fatal("Ping succeeded with nothing listening")
	}
	if buf.String() != "" {
		t.Errorf("the restored logger still wrote to the service's: %s", buf.String())
	}
	written, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(written), "redis: connection pool: failed to dial") {
		t.Errorf("go-redis's own logger wrote %q, want its failed-dial line", written)
	}
}
