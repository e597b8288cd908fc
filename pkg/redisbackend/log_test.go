package redisbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

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
			SetClientLogger(slog.New(slog.NewJSONHandler(&buf, nil)), c.every)
			t.Cleanup(func() { SetClientLogger(nil, 0) })
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
